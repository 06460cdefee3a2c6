"""Why a sequence plan leaves GPUs idle (`solvers.idle`): one machine's idle devices join one
replica's ring as more groups (of that replica's HP degree, at most the model's k), the ring is
ordered and its shards dealt by speed again as the heuristic's coarse stage builds rings
(`coarse_rings`: capped where memory binds), the other replicas keep their rings, and the
micro-batches are split again over the replicas; every replica is tried and the best plan that
fits is reported with its T and its bottleneck. A ring the heuristic polished is coarse again
once re-dealt, so the T shown is an upper bound of what those devices could give there."""

from __future__ import annotations

import time

from planner.problem import Problem
from planner.sequence import SeqPlan, evaluate
from solvers.idle import MAX_MACHINES, TIME_BUDGET_S, IdleMachine, idle_devices
from solvers.sequence.coarse import join_ring
from solvers.sequence.space import plan_of


def explain_idle(problem: Problem, plan: SeqPlan, deadline: float | None = None) -> list[IdleMachine]:
    """One explanation per machine with idle devices (at most MAX_MACHINES; none started after
    TIME_BUDGET_S or `deadline`, a `time.perf_counter` instant)."""
    deadline = min(deadline if deadline is not None else float("inf"), time.perf_counter() + TIME_BUDGET_S)
    rings = plan.rings()
    out = []
    for m, idle in list(idle_devices(problem, plan).items())[:MAX_MACHINES]:
        tried = []
        for r in range(len(rings)):  # one machine against 128 rings of 10^5 GPUs: 2.8 s, so the clock is read per ring
            if time.perf_counter() > deadline:
                return out  # this machine unexplained: the caller counts it under the time limit
            if (found := join_ring(problem, rings, r, idle)) is not None:
                tried.append((found, r))
        name = problem.cluster.machines[m].name
        if not tried:
            out.append(IdleMachine(name, idle, None, "no ring holds them as more groups within memory", None,
                                   added="more groups of a replica"))
            continue
        (t, batches, joined), replica = min(tried, key=lambda found: (found[0][0], found[1]))
        best = plan_of(problem, batches, joined)
        out.append(IdleMachine(name, idle, t, evaluate(problem, best).bottleneck.description, best,
                               added=f"more groups of replica {replica}"))
    return out
