"""Shards that fit in memory: the coarse placement's deal by speed, capped by what each group's
members can hold (docs/sequence-plans.md §7, "shards by speed, capped by memory").

Stage 1 gives each group a shard in proportion to its speed. On a mixed ring that drops the
small cards: a 24 GB RTX 4090 beside 80 GB A100s gets about a third of an A100's shard by
speed, more than its memory holds at 128K tokens, so the whole ring is over memory and the
heuristic keeps the A100s alone (333.1 s on 4 A100 + 4 RTX 4090, Llama-3 8B at 128K) where
the ring of all eight with the 4090s' shards capped is 6.7 % faster (310.9 s).

Why a ratio is exact enough: with a group's heads and its members' token fractions fixed, a
member's memory (§7.3) is a fixed part (ZeRO-3 state shard, gathered weights, reserve, ring
buffers, which follow the ring's largest group) plus a part proportional to its group's
tokens (activations, working set, logits). So `(capacity − fixed) / proportional` is the
factor by which the group's shard may grow or must shrink. The ring buffers follow the
largest group, which the redeal may change, and the members' split is rounded to token
blocks: hence a few rounds, each checked by the planner's own memory terms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.problem import Problem
from planner.sequence.pricing import memory_parts
from solvers.sequence.space import Ring, table_of

FIT_ROUNDS = 6  # redeals tried before a ring is left as dealt by speed (over memory)


def capped_proportional(weights: Sequence[float], units: int, least: Sequence[int],
                        most: Sequence[int]) -> list[int] | None:
    """`units` split by weight with least[i] ≤ part i ≤ most[i] (water-filling: parts that
    would pass their cap are fixed at it and the rest split again); None if no split fits."""
    n = len(weights)
    if sum(least) > units or sum(most) < units or any(lo > hi for lo, hi in zip(least, most)):
        return None
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(n) if i not in fixed]
        share = proportional([weights[i] for i in free], units - sum(fixed.values()), [least[i] for i in free])
        over = [i for i, part in zip(free, share) if part > most[i]]
        if not over:
            out = dict(zip(free, share)) | fixed
            return [out[i] for i in range(n)]
        fixed.update({i: most[i] for i in over})


def proportional(weights: Sequence[float], units: int, least: Sequence[int]) -> list[int] | None:
    """`units` split by weight, each part ≥ least[i] (largest remainder); None if too few."""
    extra = units - sum(least)
    if extra < 0:
        return None
    total = float(sum(weights)) or 1.0
    exact = [extra * w / total for w in weights]
    out = [lo + math.floor(x) for lo, x in zip(least, exact)]
    order = sorted(range(len(out)), key=lambda i: (math.floor(exact[i]) - exact[i], i))
    for i in order[: units - sum(out)]:
        out[i] += 1
    return out


def growth_rooms(problem: Problem, rings: Sequence[Ring]) -> tuple[list[np.ndarray], np.ndarray]:
    """Per ring, per group, the factor its shard may be scaled by and still fit (the least over
    its members of (capacity − fixed) / proportional, module docstring), and whether each ring
    fits now; one table for all the rings. A member with nothing proportional (no tokens) does
    not limit its group."""
    table, mem = _memory(problem, rings)
    proportional = mem.activations + mem.logits
    fixed = mem.total - proportional
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(proportional > 0, (mem.capacity - fixed) / proportional, np.inf)
    per_group = np.minimum.reduceat(room, table.group_start[:-1])
    return np.split(per_group, table.ring_start[1:-1]), _fits(table, mem)


def rings_fit(problem: Problem, rings: Sequence[Ring]) -> np.ndarray:
    """Whether each ring, as a replica of its own, fits in memory (one table for all; no rooms:
    the replan's dealer asks this once per deal step)."""
    return _fits(*_memory(problem, rings))


def _memory(problem: Problem, rings: Sequence[Ring]):
    """The rings' table, each a replica of its own at one micro-batch (memory does not depend on
    B_r), and its members' memory terms (the validator's §7.3 `memory_parts`)."""
    table = table_of(rings, [problem.training.micro_batch] * len(rings))
    return table, memory_parts(problem, table)


def _fits(table, mem) -> np.ndarray:
    return np.maximum.reduceat(mem.total - mem.capacity, table.member_start[:-1]) <= 0


@dataclass(frozen=True)
class ShardDeal:
    """One ring's deal for `fit_shards`: per group its weight (speed) and least units, the units
    dealt by speed alone, and how units become the ring (None where a group cannot split)."""

    weights: Sequence[float]
    least: Sequence[int]
    units: list[int]
    split: Callable[[list[int]], Ring | None]
    ring: Ring | None = None  # split(units), where the caller has split it already


def fit_shards(problem: Problem, deals: Sequence[ShardDeal]) -> list[Ring | None]:
    """For rings over memory as dealt by speed, rings `split(parts)` that fit: each round caps
    every group's units at what `growth_rooms` allows and deals the rest again by weight among
    the groups with room; the rings of a round are checked in one table (12,500 rings of a
    10^5-GPU cluster took 7.1 s one by one). None for a ring that FIT_ROUNDS rounds do not fit
    (the caller keeps its ring, and the heuristic ranks it by its overflow)."""
    out: list[Ring | None] = [None] * len(deals)
    units = {i: d.units for i, d in enumerate(deals)}
    rings = {i: d.ring if d.ring is not None else d.split(d.units) for i, d in enumerate(deals)}
    for round_ in range(FIT_ROUNDS + 1):
        live = [(i, ring) for i, ring in rings.items() if ring is not None]
        if not live:
            break
        rooms, fits = growth_rooms(problem, [ring for _, ring in live])
        rings = {}
        for (i, ring), room, fit in zip(live, rooms, fits.tolist()):
            capped = None if fit or round_ == FIT_ROUNDS else _capped(deals[i], units[i], room)
            if fit:
                out[i] = ring
            elif capped is not None:
                units[i], rings[i] = capped, deals[i].split(capped)
    return out


def _capped(deal: ShardDeal, units: list[int], room: np.ndarray) -> list[int] | None:
    """The units capped by each group's room and dealt again by weight (None: no deal fits the
    caps, or the caps change nothing)."""
    most = [max(0, math.floor(u * r)) if np.isfinite(r) else sum(units) for u, r in zip(units, room.tolist())]
    capped = capped_proportional(deal.weights, sum(units), deal.least, most)
    return None if capped is None or capped == units else capped
