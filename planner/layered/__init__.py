"""Layered plans (docs/plan-space.md §2 and §4, docs/cost-model.md §3): pipelines of tensor-parallel stages, each stage a range of
layers. Modules from the bottom up: `plan` (types) → `table` (plan as per-stage arrays) →
`rules` (rules 1–4) → `pricing` (every §3 term) → `validate` (rules 1–5) → `evaluate`
(typed estimate and bottleneck)."""

from operator import attrgetter

from planner.cost import iteration_flops
from planner.layered import calibration
from planner.layered.estimate import Bottleneck, Estimate, PipelineEstimate, StageEstimate
from planner.layered.evaluate import evaluate
from planner.layered.plan import PLAN_FORMAT, Pipeline, Plan, Stage, outline
from planner.layered.pricing import iteration_time
from planner.layered.validate import validate
from planner.plan_kind import PlanKind

KIND = PlanKind(name="layered", format=PLAN_FORMAT, schema_name="plan", plan_type=Plan, validate=validate,
                evaluate=evaluate, iteration_time=iteration_time, iteration_flops=iteration_flops,
                unit="pipeline", units=attrgetter("pipelines"), units_s=attrgetter("pipe_s"), outline=outline,
                pipeline_schedule=True, link_traffic="all-reduces and stage sends",
                timings="stages", timing_key=attrgetter("pipeline", "stage"), timed_parts=calibration.timed_parts,
                step_rows=calibration.step_rows, measured_collectives=calibration.measured_collectives,
                predicted_rows=calibration.predicted_rows)

__all__ = ["KIND", "PLAN_FORMAT", "Bottleneck", "Estimate", "Pipeline", "PipelineEstimate", "Plan",
           "Stage", "StageEstimate", "evaluate", "iteration_time", "validate"]
