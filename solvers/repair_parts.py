"""What every kind's re-plan shares (docs/checkpoints.md §10): `solvers.layered.replan` and
`solvers.sequence.replan` drop the units (pipelines, replicas) that lost too much and deal
their sequences — and, in a sequence group, a lost member's heads and tokens — to the
survivors in proportion to speed; each returns its `Candidates`, of which `solvers.replan`
keeps the faster valid plan (`valid_time`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from planner.base import plural
from planner.kinds import iteration_time, validate
from planner.problem import Problem
from solvers.common import SolveResult


class Candidates(NamedTuple):
    """A kind's re-plan candidates on the survivors' problem."""

    repaired: Any  # the old plan repaired onto the survivors (None: nothing of it survived)
    repaired_s: float | None  # its T (None: not valid, or the run cannot train it)
    changes: list[str]  # what the repair changed, one line each
    fresh: SolveResult  # the fresh solve on the survivors
    notes: list[str]  # why a fresh plan was set aside, one line each
    why: str = ""  # why no repaired plan is offered, when the repair itself says so ('' otherwise)


def valid_time(problem: Problem, plan: Any) -> float | None:
    """T of a plan of any kind when it is valid for `problem`, else None (None too for no plan)."""
    if plan is None or validate(problem, plan):
        return None
    return iteration_time(problem, plan)  # (not `evaluate`: its simulated schedules took 4 s at 10^5 GPUs)


Moves = list[tuple[int, int]]  # (load, amount) given in a row


def deal(loads: list[int], speeds: list[float], total: int, unit: int) -> list[int]:
    """`loads` grown by `total`: one `unit` at a time to the load whose share per unit of
    speed after it is least (ties: the first); a rest under one unit goes where the next unit
    would have gone."""
    return deal_capped(loads, speeds, total, unit, lambda moves: True)


def deal_capped(loads: list[int], speeds: list[float], total: int, unit: int,
                take: Callable[[Moves], bool]) -> list[int] | None:
    """`deal` under caps (water-filling): `take(moves)` gives every move when all fit (True)
    and nothing otherwise; a unit a load refuses goes to the next load by share per speed, and
    a load that refused once is passed over after (loads only grow: its room does not come
    back). None when a unit finds no load with room. Runs of units are offered at once,
    doubled after a success and halved after a refusal down to the one unit that is refused:
    the deal of one unit at a time, in few `take`s (each a memory check in a repair)."""
    out, full, left, run = list(loads), set(), total, 1
    while left > 0:
        moves = _next_moves(out, speeds, left, unit, full, run)
        if not moves:
            return None
        if take(moves):
            for j, size in moves:
                out[j] += size
            left -= sum(size for _, size in moves)
            run *= 2
        elif len(moves) == 1:
            full.add(moves[0][0])
        else:
            run = len(moves) // 2
    return out


def _next_moves(loads: list[int], speeds: list[float], left: int, unit: int, full: set[int], run: int) -> Moves:
    """The next `run` units of the plain deal over the loads not full (none when all are)."""
    out, moves, open_ = list(loads), [], [j for j in range(len(loads)) if j not in full]
    while open_ and len(moves) < run and left > 0:
        j = min(open_, key=lambda i: ((out[i] + unit) / speeds[i], i))
        size = min(unit, left)
        out[j] += size
        left -= size
        moves.append((j, size))
    return moves


def keep_or_move(repaired: list[tuple[object | None, int]], unit: str, why: str | list[str],
                 changes: list[str]) -> tuple[list, list[int], int]:
    """Of the units (replicas, pipelines) as repaired — (the repair, or None when the unit lost
    too much, `why`: one reason for all or one per unit; its batch) in plan order —: the kept
    repairs, their batches, and the sequences of the dropped units (to be dealt to the kept);
    each drop said in `changes`."""
    kept, batches, moved = [], [], 0
    for index, (repair, batch) in enumerate(repaired):
        if repair is not None:
            kept.append(repair)
            batches.append(batch)
        else:
            moved += batch
            reason = why if isinstance(why, str) else why[index]
            changes.append(f"{unit} {index} dropped ({reason}); its {plural(batch, 'sequence')} moved")
    return kept, batches, moved
