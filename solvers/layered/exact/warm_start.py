"""The exact solvers' warm start (docs/formulation.md §3): an incumbent before the first
model — the given hint, else the heuristic's plan (beyond tiny problems), else the symmetric
baseline's — checked against the problem and the solver's limits. It only cuts the models
off and hints CP-SAT; the proof is the models'.
"""

from __future__ import annotations

from planner.layered.plan import Plan
from planner.layered.pricing import iteration_time
from planner.layered.validate import validate
from planner.problem import Problem
from solvers.common import SolverOptions
from solvers.layered.baselines.symmetric import solve_symmetric
from solvers.layered.tables import specs_of_plan
from solvers.layered.heuristic import HeuristicOptions, solve_with

HEURISTIC_FROM_DEVICES = 6  # larger problems start from the heuristic's plan
# the warm starts, tried in order (the heuristic only beyond HEURISTIC_FROM_DEVICES devices)
# (the heuristic without its own exact sub-solve: that would be this solver again)
WARM_STARTS = (("heuristic", lambda problem, options: solve_with(problem, options, HeuristicOptions(exact_devices=0))),
               ("symmetric", solve_symmetric))


def warm_start(problem: Problem, options: SolverOptions, log) -> tuple[float | None, Plan | None, list | None]:
    """The warm start: the given hint, else the heuristic's plan (beyond tiny problems), else
    the symmetric baseline's. It only supplies an incumbent: a cutoff for the models (which
    also bounds CP-SAT's integer domains) and CP-SAT's hint; the proof is the models'."""
    plan, source = options.hint, "hint plan"
    if plan is None:
        plan, source = _first_warm_start(problem, options)
    if plan is None:
        return None, None, None
    if validate(problem, plan):
        log(f"{source} is invalid for this problem; ignored")
        return None, None, None
    too_long = options.max_stages and max(len(p.stages) for p in plan.pipelines) > options.max_stages
    if (options.max_pipelines and len(plan.pipelines) > options.max_pipelines) or too_long:
        log(f"{source} breaks the pipeline or stage limit; ignored")
        return None, None, None
    t = iteration_time(problem, plan)
    log(f"{source}: T = {t:.6g} s ({len(plan.pipelines)} pipelines)")
    return t, plan, specs_of_plan(problem, plan)


def _first_warm_start(problem: Problem, options: SolverOptions) -> tuple[Plan | None, str]:
    budget = SolverOptions(time_limit_s=max(0.5, min(5.0, 0.05 * options.time_limit_s)),
                           threads=options.threads, seed=options.seed)
    big = problem.cluster.num_devices > HEURISTIC_FROM_DEVICES
    for name, solver in WARM_STARTS[0 if big else 1:]:
        try:
            result = solver(problem, budget)
        except Exception:  # a warm start is optional: a failing one must not stop the proof
            continue
        if result.plan is not None:
            return result.plan.model_copy(update={"solver": None}), f"warm start ({name})"
    return None, ""
