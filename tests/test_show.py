"""`hexiscale show` and the pictures behind it: files are real PNGs with content, the Gantt
chart's bars end exactly at the evaluator's T_pipe, and the memory bars add up to the
evaluator's memory figure."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from hexiscale.viz.layered_drawing import stage_labels
from hexiscale.viz.gantt import gantt_figure
from hexiscale.viz.memory import device_memory
from hexiscale.viz.schedule import pipeline_schedule
from planner import Pipeline, Plan, Stage, evaluate, save_plan
from planner.io import load_problem
from solvers.registry import solve

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def tiny():
    """An asymmetric plan: different TP sizes, uneven layers, unequal batches, idle-free."""
    problem = load_problem("tiny-6-tiny")
    plan = Plan(problem=problem.name, pipelines=(
        Pipeline(batch=10, stages=(Stage(devices=(0, 1), layers=3), Stage(devices=(2,), layers=1))),
        Pipeline(batch=6, stages=(Stage(devices=(3,), layers=1), Stage(devices=(4, 5), layers=3))),
    ))
    return problem, plan


def symmetric_case(name):
    problem = load_problem(name)
    return problem, solve(problem, "symmetric").plan


def test_show_writes_three_png_images_with_content(tiny, tmp_path):
    problem, plan = tiny
    save_plan(plan, tmp_path / "plan.json")
    out = tmp_path / "pictures"
    result = CliRunner().invoke(app, ["show", problem.name, str(tmp_path / "plan.json"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("cluster.png", "schedule.png", "memory.png"):
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 300
        assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_show_refuses_an_invalid_plan_with_one_line(tiny, tmp_path):
    problem, _ = tiny
    bad = Plan(pipelines=(Pipeline(batch=16, stages=(Stage(devices=(0, 2), layers=4),)),))  # spans machines
    save_plan(bad, tmp_path / "bad.json")
    result = CliRunner().invoke(app, ["show", problem.name, str(tmp_path / "bad.json"), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize("case", ["tiny", "case-study-llama2-13b", "hetero1-llama2-7b"])
def test_schedule_span_is_the_evaluators_pipeline_time(case, tiny):
    problem, plan = tiny if case == "tiny" else symmetric_case(case)
    est = evaluate(problem, plan)
    for p, pipe in enumerate(est.pipelines):
        sched = pipeline_schedule(problem, est, p)
        assert sched.span_s == pytest.approx(pipe.time_s, rel=1e-12)
        dp_ends = [b.end for b in sched.of_kind("dp_sync")]
        if dp_ends:
            assert max(dp_ends) <= est.iteration_s * (1 + 1e-12)


def test_no_stage_or_link_does_two_things_at_once(tiny):
    problem, plan = tiny
    est = evaluate(problem, plan)
    for p, pipe in enumerate(est.pipelines):
        sched = pipeline_schedule(problem, est, p)
        for k, stage in enumerate(pipe.stages):
            work = sorted((b.start, b.end) for b in sched.blocks if b.stage == k and b.kind in ("forward", "backward"))
            sends = sorted((b.start, b.end) for b in sched.blocks if b.stage == k and b.kind == "send")
            for seq in (work, sends):
                assert all(a[1] <= b[0] + 1e-12 for a, b in zip(seq, seq[1:]))
            busy = sum(e - s for s, e in work)
            assert busy == pytest.approx(pipe.micro_batches * stage.tau_s, rel=1e-9)
            assert len(sends) == (0 if k == len(pipe.stages) - 1 else pipe.micro_batches)
            # the forward share is a strict part of τ (backward and recompute take the rest)
            fwd = [b for b in sched.blocks if b.stage == k and b.kind == "forward"]
            assert all(b.end - b.start < stage.tau_s for b in fwd)


def test_drawn_bars_end_at_T_pipe(tiny):
    problem, plan = tiny
    est = evaluate(problem, plan)
    schedules = [pipeline_schedule(problem, est, p) for p in range(len(est.pipelines))]
    fig = gantt_figure(schedules, stage_labels(problem, plan))
    for ax, pipe in zip(fig.axes, est.pipelines):
        xs = [path.vertices[:, 0] for coll in ax.collections if coll.get_gid() in ("forward", "backward", "send")
              for path in coll.get_paths()]
        xs = np.concatenate(xs)
        assert xs.min() == pytest.approx(0.0, abs=1e-12)
        assert xs.max() == pytest.approx(pipe.time_s, rel=1e-12)


def test_memory_bars_add_up_to_the_evaluators_figure(tiny):
    problem, plan = tiny
    est = evaluate(problem, plan)
    mem = device_memory(problem, est)
    parts = mem["state"] + mem["activation"] + mem["reserve"]
    for stage in est.stages:
        for d in stage.devices:
            assert parts[d] == pytest.approx(stage.memory_gib, rel=1e-12)
            assert mem["capacity"][d] == pytest.approx(stage.capacity_gib)
    assert (mem["pipeline"] >= 0).all()  # the tiny plan uses every device


def test_link_labels_sit_above_the_machine_boxes():
    """A label between two neighbouring machines is wider than the gap: drawn under the boxes
    it was half hidden."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    from hexiscale.viz.cluster import _draw_links, _draw_machines, machine_centres

    problem = load_problem("hetero1-llama2-7b")
    fig, ax = plt.subplots()
    centres = machine_centres(len(problem.cluster.machines))
    _draw_links(ax, problem, centres)
    _draw_machines(ax, problem, centres)
    labels = [t for t in ax.texts if t.get_text().endswith("GB/s") and "×" not in t.get_text()]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert labels and boxes
    assert min(t.get_zorder() for t in labels) > max(b.get_zorder() for b in boxes)
    assert all(t.get_bbox_patch() is not None for t in labels)  # on a white patch over the lines
    plt.close(fig)


def test_merged_spans_cover_the_same_time_up_to_a_pixel():
    """A row of more than MERGE_ABOVE spans is drawn with its sub-pixel gaps closed: fewer spans,
    every original span inside one drawn, every gap left at least a pixel wide."""
    from hexiscale.viz.gantt import MERGE_ABOVE, PIXELS, _merged

    rng = np.random.default_rng(0)
    starts = np.cumsum(rng.uniform(0.0, 2.0, 3 * MERGE_ABOVE))
    spans = [(float(a), float(w)) for a, w in zip(starts, rng.uniform(0.0, 1.5, len(starts)))]
    x_max = float(starts[-1] + 2)
    drawn = _merged(spans, x_max)
    assert len(drawn) < len(spans)
    lo, hi = np.array([a for a, _ in drawn]), np.array([a + w for a, w in drawn])
    for a, w in spans:
        k = np.searchsorted(lo, a, side="right") - 1
        assert lo[k] <= a and a + w <= hi[k] * (1 + 1e-12)
    assert (lo[1:] - hi[:-1] >= x_max / PIXELS).all()
    assert _merged(spans[:MERGE_ABOVE], x_max) == spans[:MERGE_ABOVE]  # few spans: as they are


def test_a_dense_cluster_picture_has_no_label_per_device(tmp_path):
    """Above DENSE_DEVICES the cluster picture has one marker per device and no stage numbers, a
    legend of the first pipelines, and the schedule picture is built from its panels' pipelines
    only (counted), naming how many the plan has."""
    from unittest.mock import patch

    import hexiscale.viz.schedule as schedule
    from hexiscale.viz.cluster import DENSE_DEVICES, LEGEND_PIPELINES, draw_cluster
    from hexiscale.viz.gantt import MAX_PANELS
    from hexiscale.viz.layered_drawing import draw_plan
    from instances.generate import generate_cluster, generated_problem

    problem = generated_problem(generate_cluster(1024, "A100-80G:1,RTX4090:1", 0), "llama2-7b",
                                global_batch=256, micro_batch=1)
    one_machine = [problem.cluster.devices_of(m) for m in range(64)]  # 64 pipelines of one TP-8 stage
    plan = Plan(problem=problem.name, pipelines=tuple(
        Pipeline(batch=4, stages=(Stage(devices=tuple(d), layers=problem.model.layers),)) for d in one_machine))
    assert problem.cluster.num_devices > DENSE_DEVICES and len(plan.pipelines) > max(MAX_PANELS, LEGEND_PIPELINES)
    import matplotlib.pyplot as plt
    with patch.object(plt, "close"):  # keep the figure to look at
        draw_cluster(problem, plan, tmp_path / "c.png")
    ax = plt.gcf().axes[0]
    assert not [t for t in ax.texts if t.get_text().isdigit()]
    assert len(ax.get_legend().get_texts()) == LEGEND_PIPELINES + 2  # "… more pipelines" and idle
    plt.close("all")
    built = []
    real = schedule.pipeline_schedule
    with patch.object(schedule, "pipeline_schedule", lambda *a: built.append(a[2]) or real(*a)):
        paths = draw_plan(problem, plan, tmp_path)
    assert built == list(range(MAX_PANELS)) and all(p.stat().st_size > 10_000 for p in paths)


def test_on_thousands_of_machines_the_links_drawn_are_racks_and_listed_pairs():
    """The candidates of a large cluster's picture hold every pair whose bandwidth is not the
    default (a generated cluster's racks and listed links; no vendor bridge there)."""
    from hexiscale.viz.cluster import _rack_and_link_pairs
    from instances.generate import generate_cluster

    cluster = generate_cluster(256, "A100-80G:1,RTX4090:1,H20:1", 0)
    assert cluster.racks and cluster.links
    i, j = _rack_and_link_pairs(cluster)
    every_i, every_j = np.triu_indices(len(cluster.machines), k=1)
    special = cluster.pair_bw(every_i, every_j) != cluster.inter_bw_gbps
    assert special.sum() >= 100
    assert set(zip(every_i[special].tolist(), every_j[special].tolist())) <= set(zip(i.tolist(), j.tolist()))


def test_bars_of_many_devices_are_one_polygon_per_part_with_the_same_tops():
    """Above BAR_DEVICES the stacked bars are filled steps: one artist per part (not one patch per
    device), whose top edge at each device is the bars' sum up to that part."""
    import matplotlib.pyplot as plt

    from hexiscale.viz.common import BAR_DEVICES, stacked_bars

    parts = (("a", "#111111"), ("b_c", "#222222"))
    for n in (BAR_DEVICES, BAR_DEVICES + 1):
        rng = np.random.default_rng(n)
        values = {"a": rng.random(n), "b_c": rng.random(n)}
        fig, ax = plt.subplots()
        stacked_bars(ax, np.arange(n), values, parts)
        if n <= BAR_DEVICES:
            assert len(ax.patches) == 2 * n and not ax.collections
        else:
            assert not ax.patches and [c.get_gid() for c in ax.collections] == ["a", "b_c"]
            tops = ax.collections[1].get_paths()[0].vertices[:, 1].max()
            assert tops == pytest.approx((values["a"] + values["b_c"]).max())
        assert [t.get_text() for t in ax.legend().get_texts()] == ["a", "b c"]
        plt.close(fig)
