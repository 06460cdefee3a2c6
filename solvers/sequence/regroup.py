"""Replica-level polish of the sequence heuristic: a group moves from one replica to another
(both rings placed again by stage 1 and 2 of `coarse`, then polished; a replica whose last
group leaves is merged away). What the ring moves
of `moves` cannot do: change which devices share a replica, so which ZeRO-3 shards and
which batch they serve. Tried on plans of at most MAX_GROUPS groups."""

from __future__ import annotations

import time

from planner.problem import Problem
from solvers.sequence.coarse import coarse_ring
from solvers.sequence.polish import State, polish
from solvers.sequence.space import Ring

MAX_GROUPS = 24
MAX_ROUNDS = 6
TRIED = 4  # group moves polished per round


def _devices(ring: Ring) -> list[list[int]]:
    return [[m[0] for m in g] for g in ring]


def group_moves(problem: Problem, rings: list[Ring]):
    """Every plan with one group of one replica moved to another replica (rings re-placed);
    a replica's last group leaving merges it into the other."""
    groups = [_devices(r) for r in rings]
    for r, mine in enumerate(groups):
        for g in range(len(mine)):
            left = coarse_ring(problem, mine[:g] + mine[g + 1:]) if len(mine) > 1 else []
            if left is None:
                continue
            for other in range(len(groups)):
                right = coarse_ring(problem, groups[other] + [mine[g]]) if other != r else None
                if right is not None:
                    new = list(rings)
                    new[r], new[other] = left, right
                    yield [ring for ring in new if ring]


def regroup(problem: Problem, state: State, deadline: float, seed: int = 0) -> State:
    """Move groups between replicas while the best such move (polished) improves the plan."""
    if len(state.rings) < 2 or sum(len(r) for r in state.rings) > MAX_GROUPS:
        return state
    for _ in range(MAX_ROUNDS):
        if time.perf_counter() > deadline:
            break
        tried = sorted((State.start(problem, rings) for rings in group_moves(problem, state.rings)),
                       key=lambda s: s.key)
        improved = False
        for candidate in tried[:TRIED]:
            polished = polish(problem, candidate, deadline, seed)
            if polished.key < state.key:
                state, improved = polished, True
        if not improved:
            break
    return state
