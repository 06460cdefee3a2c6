"""The problem encoded explicitly: types, the GPU catalog, the cost model, the judges.

Layers, from the bottom: `base` (units, the frozen base type) → `hardware`, `workload`,
`problem` (the inputs) → `cost` (the formulas of docs/cost-model.md) → `violations`, `solver_info`,
`plan_kind` (shared by every plan kind) → one folder per plan kind (`layered/`) → `kinds`
(dispatch on a plan's kind) → `io` (files). `evaluate`, `validate` and `iteration_time` here
accept a plan of any kind.
"""

from planner.hardware import builtin_catalog, Cluster, GpuType, Link, Machine, Vendor
from planner.io import InputError, load_cluster, load_model, load_plan, load_problem, save_plan
from planner.kinds import PLAN_KINDS, evaluate, iteration_time, kind_of, validate
from planner.layered import Bottleneck, Estimate, Pipeline, PipelineEstimate, Plan, Stage, StageEstimate
from planner.prices import cost_per_mtok, objective_value, rent_per_hour, rented_machines, within_budget
from planner.problem import Objective, Problem
from planner.solver_info import SolverInfo, SolveStatus
from planner.violations import InvalidPlanError, Violation
from planner.workload import ModelSpec, TrainingSpec

__all__ = [
    "PLAN_KINDS", "Bottleneck", "Cluster", "Estimate", "GpuType", "InputError", "InvalidPlanError", "Link",
    "Machine", "ModelSpec", "Objective", "Pipeline", "PipelineEstimate", "Plan", "Problem", "SolveStatus",
    "SolverInfo", "Stage", "StageEstimate", "TrainingSpec", "Vendor", "Violation",
    "builtin_catalog", "cost_per_mtok", "evaluate", "iteration_time", "kind_of", "load_cluster", "load_model",
    "load_plan", "load_problem", "objective_value", "rent_per_hour", "rented_machines", "save_plan", "validate",
    "within_budget",
]
