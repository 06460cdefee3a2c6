"""The local integer solve on small clusters (HexiSeq's "local fine-grained integer solve"):
with the time the heuristic's own search leaves, the exact CP-SAT model (solvers/layered/
exact, docs/formulation.md) runs with the heuristic's plan as its hint and cutoff, so it
either proves that plan optimal, finds a better one, or returns a proven lower bound.

The solver is reached by its registry name (entries are imported on first use), so the
heuristic does not import the exact package, whose driver warm-starts from the heuristic:
that warm start runs with `exact_devices=0`, so the two never call each other in a loop.
One CP-SAT worker: its search is then deterministic for a seed (unless the time limit cuts
it), as the heuristic promises.
"""

from __future__ import annotations

import time

from planner.layered.plan import Plan
from planner.problem import Problem
from solvers import registry
from solvers.common import SolveResult, SolverOptions

MIN_SECONDS = 0.5  # less time than this left: no sub-solve


def exact_sub_solve(problem: Problem, options: SolverOptions, plan: Plan | None,
                    deadline: float) -> SolveResult | None:
    """CP-SAT from `plan` (None: from nothing) until `deadline`; None if too little time."""
    left = deadline - time.perf_counter()
    if left < MIN_SECONDS:
        return None
    sub = SolverOptions(time_limit_s=left, threads=1, seed=options.seed, hint=plan,
                        max_pipelines=options.max_pipelines, max_stages=options.max_stages)
    return registry.get("cpsat")(problem, sub)
