"""hexiscale: plan and run LLM training on heterogeneous GPU clusters.

    import hexiscale as hx
    problem = hx.load_problem("instances/problems/case-study-llama2-13b.yaml")
    result = hx.solve(problem, solver="heuristic")   # kind="auto": layered, or sequence at long context
    print(hx.evaluate(problem, result.plan).iteration_s)
    run = hx.run_plan(problem, result.plan, model="tiny", steps=3)   # a layered or a sequence plan
    new = hx.replan(problem, result.plan, [3, 7])   # lost devices 3, 7: new.plan in the survivors' ids
"""

from planner import (
    Cluster, Estimate, GpuType, InputError, InvalidPlanError, Link, Machine, ModelSpec,
    Pipeline, Plan, Problem, Stage, TrainingSpec, Violation, evaluate, load_plan, load_problem,
    save_plan, validate,
)
from solvers.common import SolveResult, SolverOptions
from solvers.choose import solve  # kind='auto' by default: the kind chosen, and why (kind_reason)
from runtime.launch.launcher import run_plan
from solvers.replan import ReplanResult, replan

__all__ = [
    "Cluster", "Estimate", "GpuType", "InputError", "InvalidPlanError", "Link", "Machine",
    "ModelSpec", "Pipeline", "Plan", "Problem", "ReplanResult", "SolveResult", "SolverOptions", "Stage",
    "TrainingSpec", "Violation", "evaluate", "load_plan", "load_problem", "replan", "run_plan", "save_plan", "solve",
    "validate",
]
