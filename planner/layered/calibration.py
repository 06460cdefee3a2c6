"""What a run of a layered plan measures, and the cost model's figures for it (docs/calibration.md §9,
`planner.calibration_runs`): each stage's τ = C + T_tp per micro-batch, then T, then the
T_tp of each stage whose TP collectives the run timed. A run log times every stage (its
leader's forward, backward and TP collective seconds per step: `runtime.metrics.runlog`)."""

from __future__ import annotations

import numpy as np

from planner.layered.plan import Plan
from planner.layered.pricing import breakdown
from planner.layered.table import stage_table
from planner.problem import Problem


def timed_parts(plan: Plan) -> list[tuple[int, int]]:
    """(pipeline, stage) of every stage, in plan order: what a run log times."""
    return [(p, k) for p, pipe in enumerate(plan.pipelines) for k in range(len(pipe.stages))]


def step_rows(problem: Problem, plan: Plan, stages) -> dict[str, list[float]]:
    """One step's stage timings as each stage's forward + backward (τ) and TP collective time,
    per micro-batch of its pipeline."""
    micro = [pipe.batch // problem.training.micro_batch for pipe in plan.pipelines for _ in pipe.stages]
    return {"stage_s": [(st.forward_s + st.backward_s) / m for st, m in zip(stages, micro)],
            "tp_s": [st.tp_s / m for st, m in zip(stages, micro)]}


def measured_collectives(record) -> tuple[tuple[str, int], ...]:
    """("tp", stage) of each stage whose T_tp the record measured: TP size above 1 and a time
    recorded (a stage of one device has no TP collectives)."""
    if not record.tp_s:
        return ()
    sizes = [stage.tp for pipe in record.plan.pipelines for stage in pipe.stages]
    return tuple(("tp", i) for i, (t, seconds) in enumerate(zip(sizes, record.tp_s)) if t > 1 and seconds > 0)


def predicted_rows(problem: Problem, plan: Plan, collectives: tuple[tuple[str, int], ...] = ()) -> np.ndarray:
    """[τ of each stage, then T, then T_tp of each stage in `collectives`] (§3)."""
    priced = breakdown(problem, stage_table(problem, plan))
    return np.concatenate([priced.tau, [priced.iteration], [priced.tp[i] for _, i in collectives]])
