"""The registry's `heuristic`, `cpsat` and `milp` for layered plans, composed from parts that
never import each other (issue 28): the heuristic (`heuristic/`) never reaches the exact
models, and the exact models (`exact/`) take their warm start as a function. This module,
above both, joins them:

- `solve_heuristic`: the heuristic's own search, then on clusters up to
  `HeuristicOptions.exact_devices` the exact CP-SAT model from its plan with the time left
  (HexiSeq's "local fine-grained integer solve"), so it proves that plan optimal, finds a
  better one, or returns a proven lower bound. One CP-SAT worker: its search is then
  deterministic for a seed (unless the time limit cuts it), as the heuristic promises.
- `solve_cpsat`, `solve_milp`: the exact models, warm-started beyond tiny problems from the
  default heuristic's own search (the user's heuristic less its exact refinement, which
  would be the model being warm-started), so they never return a plan worse than it.

The exact solvers are imported on first use: asking for the heuristic on a large cluster
never imports OR-Tools.
"""

from __future__ import annotations

import time

from planner.layered.plan import Plan
from planner.layered.pricing import iteration_time
from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.layered.heuristic import HeuristicOptions, solve_with as own_search
from solvers.layered.heuristic.search import plan_result

MIN_REFINE_SECONDS = 0.5  # less time than this left after the search: no exact refinement
REFINE_SHARE = 0.5  # the search's structure moves leave this share of the time left to it


def heuristic_warm_start(problem: Problem, options: SolverOptions) -> SolveResult:
    """The exact solvers' default warm start: the default heuristic's own search."""
    return own_search(problem, options, HeuristicOptions())


def solve_cpsat(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """CP-SAT over the whole plan space, warm-started from the heuristic's plan."""
    from solvers.layered.exact import cpsat

    return cpsat.solve(problem, options, warm_start_fn=heuristic_warm_start)


def solve_milp(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The MILP over the whole plan space, warm-started from the heuristic's plan."""
    from solvers.layered.exact import milp

    return milp.solve(problem, options, warm_start_fn=heuristic_warm_start)


# the models carry a budget themselves (rented_M, solvers/layered/exact/rent.py): solvers/objective.py
# hands them the problem as it is instead of solving them on machine sets
solve_cpsat.honours_budget = solve_milp.honours_budget = True


def solve_heuristic(problem: Problem, options: SolverOptions) -> SolveResult:
    """The registry's `heuristic`: the default heuristic with its exact refinement."""
    return solve_with(problem, options, HeuristicOptions())


def solve_with(problem: Problem, options: SolverOptions, heuristic: HeuristicOptions,
               name: str = "heuristic") -> SolveResult:
    """The heuristic's own search, then (the plain heuristic on clusters up to
    `heuristic.exact_devices`) CP-SAT from its plan until the time limit; the better plan,
    `optimal` only when CP-SAT proves it."""
    start = time.perf_counter()
    refine = heuristic.is_plain and problem.cluster.num_devices <= heuristic.exact_devices
    own = own_search(problem, options, heuristic, name, reserve_share=REFINE_SHARE if refine else 0.0)
    if not refine:
        return own
    plan = own.plan.model_copy(update={"solver": None}) if own.plan is not None else None
    exact = exact_refinement(problem, options, plan, start + options.time_limit_s)
    return _refined(problem, name, own, exact, time.perf_counter() - start)


def exact_refinement(problem: Problem, options: SolverOptions, plan: Plan | None,
                     deadline: float) -> SolveResult | None:
    """CP-SAT from `plan` (None: from its own warm start) until `deadline`; None if too little
    time is left."""
    left = deadline - time.perf_counter()
    if left < MIN_REFINE_SECONDS:
        return None
    sub = SolverOptions(time_limit_s=left, threads=1, seed=options.seed, hint=plan,
                        max_pipelines=options.max_pipelines, max_stages=options.max_stages)
    return solve_cpsat(problem, sub)


def _refined(problem: Problem, name: str, own: SolveResult, exact: SolveResult | None,
             wall: float) -> SolveResult:
    """The search's result joined with the refinement's: the better plan (CP-SAT's only when
    strictly better), CP-SAT's bound and proof, and a note of what it established."""
    if exact is None:
        return own.model_copy(update={"wall_s": wall})
    best = (own.objective_s, own.plan) if own.plan is not None else None
    if exact.plan is not None:
        t = iteration_time(problem, exact.plan)
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, exact.plan.model_copy(update={"solver": None}))
    if best is None:
        proven = exact.status == SolveStatus.infeasible
        return (SolveResult(solver=name, status=exact.status, wall_s=wall, message=exact.message) if proven
                else own.model_copy(update={"wall_s": wall}))
    t, plan = best
    proven = exact.status == SolveStatus.optimal
    note = ("; optimal (proved by the exact sub-solve, cpsat)" if proven else
            f"; exact sub-solve (cpsat) stopped at the time limit: {exact.status.value}"
            + (f", bound {exact.bound_s:.6g} s" if exact.bound_s is not None else ""))
    return plan_result(problem, name, t, plan, wall=wall, note=note, restrictions=exact.restrictions,
                       status=SolveStatus.optimal if proven else SolveStatus.feasible,
                       bound=min(exact.bound_s, t) if exact.bound_s is not None else None)
