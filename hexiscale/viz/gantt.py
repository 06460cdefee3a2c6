"""The pipeline schedule as a Gantt chart: one panel per pipeline, one row per stage."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from hexiscale.viz.schedule import PipelineSchedule  # noqa: E402
from planner.base import plural

COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "send": "#55A868", "dp_sync": "#8172B3",
           "bubble": "#E8E8E8"}
ROW = 0.8  # height of a stage row; sends use the lower quarter of it
MAX_PANELS = 8


# A row of more spans than this is drawn with the gaps under a pixel closed (1,320 pixels across
# the chart): 10^5 micro-batches would be 10^5 rectangles a row, each under a pixel
MERGE_ABOVE = 2000
PIXELS = 1320


def _spans(sched: PipelineSchedule) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """(start, width) of every block, by (stage, kind), in one pass over the blocks."""
    out: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for b in sched.blocks:
        out.setdefault((b.stage, b.kind), []).append((b.start, b.end - b.start))
    return out


def _merged(spans: list[tuple[float, float]], x_max: float) -> list[tuple[float, float]]:
    """The spans with every gap under one pixel closed, where there are more than MERGE_ABOVE."""
    if len(spans) <= MERGE_ABOVE:
        return spans
    start = np.array([a for a, _ in spans])
    end = start + np.array([w for _, w in spans])
    order = np.argsort(start)
    start, end = start[order], np.maximum.accumulate(end[order])
    new = np.concatenate([[True], start[1:] - end[:-1] > x_max / PIXELS])  # a gap of a pixel or more
    firsts = np.flatnonzero(new)
    lasts = np.concatenate([firsts[1:] - 1, [len(start) - 1]])
    return list(zip(start[firsts].tolist(), (end[lasts] - start[firsts]).tolist()))


def _draw_pipeline(ax, sched: PipelineSchedule, stage_labels: list[str], x_max: float) -> None:
    by_row = _spans(sched)
    for k in range(sched.num_stages):
        y = k - ROW / 2
        ax.broken_barh([(0, sched.span_s)], (y, ROW), facecolors=COLOURS["bubble"], gid="bubble")
        for kind in ("forward", "backward", "dp_sync"):
            spans = _merged(by_row.get((k, kind), []), x_max)
            if spans:
                # few blocks: white seams between them; many: an outline in their own colour, so
                # blocks thinner than a pixel still show
                ax.broken_barh(spans, (y + ROW * 0.25, ROW * 0.75), facecolors=COLOURS[kind], gid=kind,
                               edgecolors="white" if len(spans) < 40 else COLOURS[kind], linewidth=0.3)
        sends = _merged(by_row.get((k, "send"), []), x_max)
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


def gantt_figure(schedules: list[PipelineSchedule], stage_labels: list[list[str]], title: str = "",
                 pipelines: int | None = None):
    """The chart of up to MAX_PANELS pipelines; bar collections carry their kind as gid.
    `pipelines`: how many the plan has, where `schedules` holds only the first ones."""
    shown = schedules[:MAX_PANELS]
    total = len(schedules) if pipelines is None else pipelines
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
    more = f" (first {len(shown)} of {plural(total, 'pipeline')})" if total > len(shown) else ""
    fig.suptitle((title + "\n" if title else "") + "cost-model timeline of §3.3 (a flow line: not the order of operations that runs)" + more,
                 fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97 if len(shown) > 2 else 0.93))
    return fig


def draw_gantt(schedules: list[PipelineSchedule], stage_labels: list[list[str]], path, title: str = "",
               pipelines: int | None = None) -> None:
    """Write the chart to `path` (PNG)."""
    fig = gantt_figure(schedules, stage_labels, title, pipelines)
    fig.savefig(path, dpi=110)
    plt.close(fig)
