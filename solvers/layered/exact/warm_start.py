"""The exact solvers' warm start (docs/formulation.md §3): an incumbent before the first
model — the given hint, else the plan of the warm-start function the caller passes (beyond
tiny problems), else the symmetric baseline's — checked against the problem and the
solver's limits. It only cuts the models off and hints CP-SAT; the proof is the models'.

The function is passed in, never imported here: the registry's composition
(solvers/layered/composed.py) passes the heuristic's own search, so this package imports
nothing from the heuristic, which in turn never reaches these models (no cycle, issue 28).
"""

from __future__ import annotations

from typing import Callable

from planner.layered.plan import Plan
from planner.layered.pricing import iteration_time
from planner.layered.validate import validate
from planner.prices import within_budget
from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions
from solvers.layered.baselines.symmetric import solve_symmetric
from solvers.layered.tables import specs_of_plan
from solvers.objective import honouring
from planner.base import plural

# a solver whose plan starts the exact search (e.g. the heuristic's own search)
WarmStartFn = Callable[[Problem, SolverOptions], SolveResult]
WARM_START_SHARE = 0.5  # of the solve's time limit, at most, for the warm-start function
GIVEN_FROM_DEVICES = 6  # larger problems start from the given function's plan (smaller ones:
# the symmetric baseline's is cheaper, and the models prove such problems quickly anyway)


def warm_start(problem: Problem, options: SolverOptions, log,
               warm_start_fn: WarmStartFn | None = None) -> tuple[float | None, Plan | None, list | None]:
    """The warm start: the given hint, else `warm_start_fn`'s plan (beyond tiny problems),
    else the symmetric baseline's. It only supplies an incumbent: a cutoff for the models
    (which also bounds CP-SAT's integer domains) and CP-SAT's hint; the proof is the models'."""
    plan, source = options.hint, "hint plan"
    if plan is None:
        plan, source = _first_warm_start(problem, options, warm_start_fn)
    if plan is None:
        return None, None, None
    if validate(problem, plan):
        log(f"{source} is invalid for this problem; ignored")
        return None, None, None
    if not within_budget(problem, plan):
        log(f"{source} rents more than the budget per hour; ignored")
        return None, None, None
    too_long = options.max_stages and max(len(p.stages) for p in plan.pipelines) > options.max_stages
    if (options.max_pipelines and len(plan.pipelines) > options.max_pipelines) or too_long:
        log(f"{source} breaks the pipeline or stage limit; ignored")
        return None, None, None
    t = iteration_time(problem, plan)
    log(f"{source}: T = {t:.6g} s ({plural(len(plan.pipelines), 'pipeline')})")
    return t, plan, specs_of_plan(problem, plan)


def _first_warm_start(problem: Problem, options: SolverOptions,
                      warm_start_fn: WarmStartFn | None) -> tuple[Plan | None, str]:
    """The first plan of the warm starts, tried in order: `warm_start_fn` (beyond
    GIVEN_FROM_DEVICES devices), then the symmetric baseline."""
    # half the time: the heuristic stops when its work is done (seconds on the paper settings),
    # so the warm start is the plan the heuristic alone returns (issue 33: 5 s of 120 s once
    # gave CP-SAT a start 3.7 % slower than the heuristic's own plan)
    # never past the solve's own limit: a frontier's budget levels solve with shares under 0.5 s, and
    # a floor of 0.5 s took `solve -s cpsat -t 5` with the cost objective to 5.05 s
    budget = SolverOptions(time_limit_s=min(options.time_limit_s, max(0.5, WARM_START_SHARE * options.time_limit_s)),
                           threads=options.threads, seed=options.seed)
    big = problem.cluster.num_devices > GIVEN_FROM_DEVICES
    starts = ([warm_start_fn] if warm_start_fn is not None and big else []) + [solve_symmetric]
    for solver in (honouring(start, exact=False) for start in starts):  # within the budget, if any
        try:
            result = solver(problem, budget)
        except Exception:  # a warm start is optional: a failing one must not stop the proof
            continue
        if result.plan is not None:
            return result.plan.model_copy(update={"solver": None}), f"warm start ({result.solver})"
    return None, ""
