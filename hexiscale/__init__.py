"""hexiscale: plan and run LLM training on heterogeneous GPU clusters.

    import hexiscale as hx
    problem = hx.load_problem("tiny-2-tiny")   # a bundled name (from any folder) or a file's path
    result = hx.solve(problem, solver="heuristic")   # kind="auto": layered, or sequence at long context
    print(hx.evaluate(problem, result.plan).iteration_s)
    run = hx.run_plan(problem, result.plan, model="tiny", steps=2)   # a layered or a sequence plan
    new = hx.replan(problem, result.plan, [0])   # lost device 0: new.plan in the survivors' ids

validate, evaluate, solve, replan and run_plan check their problem and plan afresh (one made with
`model_copy(update=...)` too: pydantic does not validate those) and take a file's path or a
bundled name in their place; a bad field is an InputError naming it. run_plan starts one process
per device of the plan, at most 8 per core (RunError beyond: use `hexiscale run --torchrun`).
"""

from planner import (
    Cluster, Estimate, GpuType, InputError, InvalidPlanError, Link, Machine, ModelSpec,
    Pipeline, Plan, Problem, Stage, TrainingSpec, Violation, load_plan, load_problem, save_plan,
)
from solvers.common import SolveResult, SolverOptions
from solvers.replan import ReplanResult
# each checks its problem and plan afresh (hexiscale/api.py); solve: kind='auto' by default, the
# kind chosen and why in kind_reason
from hexiscale.api import evaluate, replan, run_plan, solve, validate

__all__ = [
    "Cluster", "Estimate", "GpuType", "InputError", "InvalidPlanError", "Link", "Machine",
    "ModelSpec", "Pipeline", "Plan", "Problem", "ReplanResult", "SolveResult", "SolverOptions", "Stage",
    "TrainingSpec", "Violation", "evaluate", "load_plan", "load_problem", "replan", "run_plan", "save_plan", "solve",
    "validate",
]
