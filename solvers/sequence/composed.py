"""The registry's `heuristic` for sequence plans, composed as the layered one is
(solvers/layered/composed.py): HexiSeq's two-stage heuristic (`heuristic`), then, on clusters
whose device sets per machine can be listed (`bound.keys.MAX_KEYS`: about five 8-GPU
machines), the configuration bound's rounds from its plan with the time left
(`bound.solver.improve`, docs/sequence_bounds.md §4). The rounds pick the replicas' device
sets, which no deal of whole groups builds: on the bundled 32-GPU long-context problem the
heuristic's own plan (two 8-H100 replicas, the 16 A100 idle) was 13.9 % from the proven
bound, the refined one (two 7-H100 replicas beside two of 1 H100 + 6 A100) 0.4 %, in about
3 s. The result carries the bound, and is `optimal` where the rounds prove it.

The heuristic's own search never reaches the bound's modules (they import it, for their
incumbent and their rings); this module, above both, joins them.
"""

from __future__ import annotations

import time

from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.sequence import heuristic
from solvers.sequence.bound.keys import MAX_KEYS, key_count
from solvers.sequence.bound.solver import improve

NAME = "heuristic"
# Of the time limit: the heuristic's own search may use the rest. Where its search ends early
# (under a second up to 32 GPUs), the rounds get whatever it leaves.
REFINE_SHARE = 0.5
MIN_REFINE_SECONDS = 0.5  # less time than this left after the search: no refinement


def refines(problem: Problem) -> bool:
    """Whether the configuration bound's rounds follow the heuristic on this cluster."""
    return key_count(problem) <= MAX_KEYS


def solve_heuristic(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The heuristic's own search, then the configuration bound's rounds from its plan where
    `refines` (module docstring): the better plan and, where the rounds finish, its proof."""
    options = options or SolverOptions()
    start = time.perf_counter()
    if not refines(problem):
        return heuristic.solve(problem, options)
    own = heuristic.solve(problem, options.model_copy(update={"time_limit_s": options.time_limit_s * (1 - REFINE_SHARE)}))
    left = start + options.time_limit_s - time.perf_counter()
    if own.status == SolveStatus.infeasible or left < MIN_REFINE_SECONDS:
        return own.model_copy(update={"wall_s": time.perf_counter() - start})
    return improve(problem, options, own, start, name=NAME)
