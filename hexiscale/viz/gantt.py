"""The pipeline schedule as a Gantt chart: one panel per pipeline, one row per stage."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from hexiscale.viz.schedule import PipelineSchedule  # noqa: E402
from planner.base import plural

COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "send": "#55A868", "dp_sync": "#8172B3",
           "bubble": "#E8E8E8"}
ROW = 0.8  # height of a stage row; sends use the lower quarter of it
MAX_PANELS = 8


def _draw_pipeline(ax, sched: PipelineSchedule, stage_labels: list[str], x_max: float) -> None:
    for k in range(sched.num_stages):
        y = k - ROW / 2
        ax.broken_barh([(0, sched.span_s)], (y, ROW), facecolors=COLOURS["bubble"], gid="bubble")
        for kind in ("forward", "backward", "dp_sync"):
            spans = [(b.start, b.end - b.start) for b in sched.blocks if b.stage == k and b.kind == kind]
            if spans:
                # few blocks: white seams between them; many: an outline in their own colour, so
                # blocks thinner than a pixel still show
                ax.broken_barh(spans, (y + ROW * 0.25, ROW * 0.75), facecolors=COLOURS[kind], gid=kind,
                               edgecolors="white" if len(spans) < 40 else COLOURS[kind], linewidth=0.3)
        sends = [(b.start, b.end - b.start) for b in sched.blocks if b.stage == k and b.kind == "send"]
        if sends:
            ax.broken_barh(sends, (y, ROW * 0.22), facecolors=COLOURS["send"], gid="send",
                           edgecolors=COLOURS["send"], linewidth=0.4)
    ax.axvline(sched.span_s, color="black", linestyle="--", linewidth=0.8)
    ax.text(sched.span_s, -0.9, f" T_pipe {sched.span_s:.3g} s", fontsize=7, va="bottom")
    ax.set_yticks(range(sched.num_stages), stage_labels, fontsize=7 if sched.num_stages < 24 else 5)
    ax.set_ylim(sched.num_stages - 0.5, -1.0)
    ax.set_xlim(0, x_max * 1.02)
    stages = f"{sched.num_stages} stage" + ("s" if sched.num_stages > 1 else "")
    ax.set_title(f"pipeline {sched.pipeline}: {stages}, m = {sched.micro_batches} "
                 f"micro-batches, cycle {sched.cycle_s:.3g} s", fontsize=9, loc="left")


def gantt_figure(schedules: list[PipelineSchedule], stage_labels: list[list[str]], title: str = ""):
    """The chart of up to MAX_PANELS pipelines; bar collections carry their kind as gid."""
    shown = schedules[:MAX_PANELS]
    heights = [max(1.2, 0.28 * s.num_stages + 0.6) for s in shown]
    fig, axes = plt.subplots(len(shown), 1, figsize=(12, sum(heights) + 1.2), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    x_max = max(s.iteration_s for s in shown)
    for ax, sched in zip(axes[:, 0], shown):
        _draw_pipeline(ax, sched, stage_labels[sched.pipeline], x_max)
    axes[-1, 0].set_xlabel("time in the iteration (s)")
    handles = [Patch(color=COLOURS[k], label=k.replace("_", " ")) for k in ("forward", "backward", "send", "dp_sync")]
    handles.append(Patch(color=COLOURS["bubble"], label="bubble (idle)"))
    fig.legend(handles=handles, loc="upper right", ncol=5, fontsize=8, frameon=False)
    more = f" (first {MAX_PANELS} of {plural(len(schedules), 'pipeline')})" if len(schedules) > MAX_PANELS else ""
    fig.suptitle((title + "\n" if title else "") + "cost-model timeline of §3.3 (a flow line: not the order of operations that runs)" + more,
                 fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97 if len(shown) > 2 else 0.93))
    return fig


def draw_gantt(schedules: list[PipelineSchedule], stage_labels: list[list[str]], path, title: str = "") -> None:
    """Write the chart to `path` (PNG)."""
    fig = gantt_figure(schedules, stage_labels, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
