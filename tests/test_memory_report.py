"""What a layered run reports of its memory: on a GPU each stage's allocator peak per step
(runtime/layered/worker.py), which `hexiscale run` prints beside §3.5's W_σ + Act_σ for the
problem as run (hexiscale/cli/layered_views.memory_table); nothing on CPU, whose resident set
holds torch itself. The GPU side was run on an H200 (docs/device-check.md); here the table's
arithmetic and the worker's bookkeeping."""

from __future__ import annotations

import math

from rich.console import Console

from hexiscale.cli.layered_views import memory_table
from planner.io import load_plan, load_problem
from planner.layered.evaluate import evaluate
from runtime.layered.layout import rank_layout
from runtime.layered.worker import stage_peak
from runtime.precision import SCHEMES, held_training


def steps_with_peaks(plan, peaks_by_step: list[list[float]]) -> list[dict]:
    stages = [(p, k) for p, pipe in enumerate(plan.pipelines) for k in range(len(pipe.stages))]
    return [{"step": i + 1, "stages": [{"pipeline": p, "stage": k, "forward_s": 0.0, "backward_s": 0.0,
                                        "peak_mib": peaks[j]} for j, (p, k) in enumerate(stages)]}
            for i, peaks in enumerate(peaks_by_step)]


def test_the_table_sets_each_stages_largest_peak_after_warm_up_beside_w_plus_act():
    problem, plan = load_problem("demo-tiny"), load_plan("demo-tiny")
    stages = sum(len(p.stages) for p in plan.pipelines)
    # the warm-up steps (1, 2) hold the largest numbers: they must not count
    peaks = [[9999.0] * stages, [9999.0] * stages, [100.0 + j for j in range(stages)], [50.0] * stages]
    text = render(memory_table(problem, plan, steps_with_peaks(plan, peaks)))
    priced = [s for p in evaluate(problem, plan).pipelines for s in p.stages]
    for j, stage in enumerate(priced):
        measured = (100.0 + j) / 1024
        both = stage.states_gib + stage.activations_gib
        assert f"{measured:.2f}" in text and f"{both:.2f}" in text and f"{measured / both:.3f}" in text
    assert "9.76" not in text  # 9999 MiB of the warm-up


def test_no_table_without_a_measured_peak():
    problem, plan = load_problem("demo-tiny"), load_plan("demo-tiny")
    stages = sum(len(p.stages) for p in plan.pipelines)
    steps = steps_with_peaks(plan, [[1.0] * stages] * 4)
    for step in steps:
        del step["stages"][0]["peak_mib"]
    assert memory_table(problem, plan, steps) is None


def test_a_stage_reports_its_largest_rank_and_nothing_off_a_gpu():
    plan = load_plan("demo-tiny")
    layout = rank_layout(plan)
    peaks = [float(10 * rank) for rank in range(layout.world_size)]
    for stage in layout.stages:
        assert stage_peak(stage, peaks) == {"peak_mib": max(peaks[r] for r in stage.ranks)}
        assert stage_peak(stage, [math.nan] * layout.world_size) == {}


def test_the_problem_as_run_holds_its_precisions_bytes():
    training = load_problem("demo-tiny").training
    for name, scheme in SCHEMES.items():
        held = held_training(training, name)
        assert (held.param_state_bytes, held.weight_bytes, held.grad_bytes, held.optimizer_bytes, held.act_bytes) == (
            scheme.param_state_bytes, scheme.weight_bytes, scheme.grad_bytes, scheme.optimizer_bytes, scheme.act_bytes)


def render(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()
