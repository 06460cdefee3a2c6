"""The problem encoded explicitly: types, the GPU catalog, the cost model, the evaluator."""

from planner.estimate import Bottleneck, Estimate, PipelineEstimate, StageEstimate
from planner.evaluate import InvalidPlanError, evaluate, iteration_time
from planner.hardware import Cluster, GpuType, Link, Machine, Vendor, builtin_catalog
from planner.io import InputError, load_cluster, load_model, load_plan, load_problem, save_plan
from planner.plan import Pipeline, Plan, SolverInfo, SolveStatus, Stage
from planner.problem import Problem
from planner.validate import Violation, validate
from planner.workload import ModelSpec, TrainingSpec

__all__ = [
    "Bottleneck", "Cluster", "Estimate", "GpuType", "InputError", "InvalidPlanError", "Link",
    "Machine", "ModelSpec", "Pipeline", "PipelineEstimate", "Plan", "Problem", "SolveStatus",
    "SolverInfo", "Stage", "StageEstimate", "TrainingSpec", "Vendor", "Violation",
    "builtin_catalog", "evaluate", "iteration_time", "load_cluster", "load_model", "load_plan",
    "load_problem", "save_plan", "validate",
]
