"""What a run of a layered plan measures, and the cost model's figures for it (DESIGN.md §9,
`planner.calibration_runs`): each stage's τ = C + T_tp per micro-batch, then T, then the
T_tp of each stage whose TP collectives the run timed."""

from __future__ import annotations

import numpy as np

from planner.layered.plan import Plan
from planner.layered.pricing import breakdown
from planner.layered.table import stage_table
from planner.problem import Problem


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
