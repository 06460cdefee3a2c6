"""The training's schedule simulated for every pipeline of a layered plan (docs/cost-model.md
§3.3): each pipeline's makespan from its stages' forward and backward times and its hops'
send times, the same per-stage figures §3.1–§3.2 price. The evaluator reports it beside
T_pipe; the objective stays §3.3's closed form.

A stage's τ = C + T_tp is cut into its forward and its backward as the passes cut the work:
of the c passes of C (3, or 4 with recompute) the forward is one, and of the r TP
all-reduces of T_tp (4, or 6 with recompute) the forward runs two; the backward (with the
recomputed forward) is the rest. A hop's T_pp is the activation there and its gradient
back: half each way.
"""

from __future__ import annotations

import numpy as np

from planner.cost import pass_multiplier
from planner.layered.cost import tp_rounds
from planner.layered.table import StageTable
from planner.pipeline_batch import PaddedPipelines
from planner.pipeline_sim import simulated_makespans
from planner.workload import TrainingSpec

FORWARD_TP_ROUNDS = 2  # the all-reduces after the attention block and after the MLP [3.1]


def forward_time(training: TrainingSpec, compute, tp):
    """The forward pass's part of τ: C/c + 2·T_tp/r (element-wise)."""
    return compute / pass_multiplier(training) + tp * FORWARD_TP_ROUNDS / tp_rounds(training)


def stage_pipelines(training: TrainingSpec, table: StageTable, compute, tp, tau, pp) -> PaddedPipelines:
    """Every pipeline of the table as the simulation reads it."""
    forward = forward_time(training, compute, tp)
    return PaddedPipelines.of_stages(table.pipe, forward, tau - forward, pp / 2.0, pp / 2.0,
                                     table.batch // training.micro_batch)


def simulated_pipe_times(training: TrainingSpec, table: StageTable, compute, tp, tau, pp) -> np.ndarray:
    """Each pipeline's makespan under the training's schedule, simulated."""
    return simulated_makespans(stage_pipelines(training, table, compute, tp, tau, pp), training.schedule)
