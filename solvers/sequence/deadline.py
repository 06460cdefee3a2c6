"""The time limit of one sequence-heuristic solve (issue 29: `SolverOptions.time_limit_s` bounds
the whole solve at any cluster size, +5 % or +0.2 s at most).

`Clock` cuts the limit into phases by shares of it and keeps the longest step of each kind
so far: a step starts only when one as long still ends by its phase's deadline (at 100k GPUs
one coarse plan takes 0.4 s, and before issue 29 a T_dp took 3.7 s). Polish stops early
enough to build the returned plan (`plan_building`) and to check and price it whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.problem import Problem
from solvers.sequence.space import Ring, paused_gc, plan_of

FIRST_PLAN_LATE_S = 0.1  # the first plan may come this late; later the search gives up (unknown)
SAMPLED_RINGS = 16  # rings built to time the building of the returned plan
FINAL_PRICING = 4.0  # polish stops this many `State.start` times before the end: the plan is checked and priced again

Candidate = tuple[tuple[float, float], list[int], list[Ring], tuple]


@dataclass
class Clock:
    """One solve's time limit, cut into phases by shares of it, and the longest step of each
    kind so far (`took`, by kind: "uniform", "coarse", "start")."""

    start: float
    limit: float
    took: dict[str, float] = field(default_factory=dict)

    def at(self, share: float) -> float:
        return self.start + share * self.limit

    def too_late(self) -> bool:
        """Past the limit by more than a first plan may be late: give up (no plan yet)."""
        return time.perf_counter() > self.at(1.0) + FIRST_PLAN_LATE_S

    def allows(self, kind: str, deadline: float, guess: float = 0.0) -> bool:
        """Whether a step of this kind, as long as the longest so far (else `guess`), ends by the deadline."""
        return time.perf_counter() + self.took.get(kind, guess) <= deadline

    def timed(self, kind: str, step, *args):
        """step(*args), its time kept as the kind's longest."""
        began = time.perf_counter()
        out = step(*args)
        self.took[kind] = max(self.took.get(kind, 0.0), time.perf_counter() - began)
        return out


def polish_end(clock: Clock, building: float) -> float:
    """When polish stops: the end less the time to build the returned plan and to price it
    whole (FINAL_PRICING `State.start` times)."""
    return clock.at(1.0) - building - FINAL_PRICING * clock.took.get("start", 0.0)


def plan_building(problem: Problem, starts: list[Candidate]) -> float:
    """The time `space.result` takes to build the plan of the largest start (a pydantic object
    per member: 0.3 s at 20,000 members), from the time to build a few of its rings, doubled
    (a short sample misses the allocator's slow down)."""
    if not starts:
        return 0.0
    _, batches, rings, _ = max(starts, key=lambda c: sum(len(g) for ring in c[2] for g in ring))
    sample = min(len(rings), SAMPLED_RINGS)
    with paused_gc():  # as `space.result` builds it
        began = time.perf_counter()
        plan_of(problem, batches[:sample], rings[:sample])
        took = time.perf_counter() - began
    return 2.0 * took * len(rings) / sample
