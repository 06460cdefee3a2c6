"""What every kind's re-plan shares (docs/checkpoints.md §10): `solvers.layered.replan` and
`solvers.sequence.replan` drop the units (pipelines, replicas) that lost too much and deal
their sequences — and, in a sequence group, a lost member's heads and tokens — to the
survivors in proportion to speed; each returns its `Candidates`, of which `solvers.replan`
keeps the faster valid plan (`valid_time`).
"""

from __future__ import annotations

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


def valid_time(problem: Problem, plan: Any) -> float | None:
    """T of a plan of any kind when it is valid for `problem`, else None (None too for no plan)."""
    if plan is None or validate(problem, plan):
        return None
    return iteration_time(problem, plan)  # (not `evaluate`: its simulated schedules took 4 s at 10^5 GPUs)


def deal(loads: list[int], speeds: list[float], total: int, unit: int) -> list[int]:
    """`loads` grown by `total`: one `unit` at a time to the load whose share per unit of
    speed after it is least (ties: the first); a rest under one unit goes where the next unit
    would have gone."""
    out = list(loads)
    for _ in range(total // unit):
        out[_next(out, speeds, unit)] += unit
    if total % unit:
        out[_next(out, speeds, unit)] += total % unit
    return out


def keep_or_move(repaired: list[tuple[object | None, int]], unit: str, why: str,
                 changes: list[str]) -> tuple[list, list[int], int]:
    """Of the units (replicas, pipelines) as repaired — (the repair, or None when the unit lost
    too much, `why`; its batch) in plan order —: the kept repairs, their batches, and the
    sequences of the dropped units (to be dealt to the kept); each drop said in `changes`."""
    kept, batches, moved = [], [], 0
    for index, (repair, batch) in enumerate(repaired):
        if repair is not None:
            kept.append(repair)
            batches.append(batch)
        else:
            moved += batch
            changes.append(f"{unit} {index} dropped ({why}); its {plural(batch, 'sequence')} moved")
    return kept, batches, moved


def _next(loads: list[int], speeds: list[float], unit: int) -> int:
    return min(range(len(loads)), key=lambda j: ((loads[j] + unit) / speeds[j], j))
