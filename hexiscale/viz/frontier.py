"""The time–rent frontier as a picture, `frontier.png` (docs/prices.md §13): T against rent per
hour, every plan the budget levels gave as a grey dot, the Pareto-optimal ones joined by a step
line and numbered, a key beside the axes with the GPUs each rents, its rent, T and cost per
token, the cheapest per token and the fastest marked. The
title says whether each point is proven (the exact frontier) or the frontier is a heuristic's."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from hexiscale.viz.common import picture_paths  # noqa: E402
from planner.base import format_seconds  # noqa: E402

FRONT, CHEAPEST, FASTEST, OTHER = "#4C72B0", "#55A868", "#C44E52", "#BBBBBB"


def draw_frontier(problem, front, labels: list[str], out_dir: str | Path, prefix: str = "") -> Path:
    """Write frontier.png (PREFIX-frontier.png) into out_dir; `labels` name each point's rented GPUs."""
    (path,) = picture_paths(out_dir, prefix, ("frontier",))
    fig, ax = plt.subplots(figsize=(11.5, 6))
    solved = [s for s in front.solves if s.iteration_s is not None]
    ax.scatter([s.rent_per_hour for s in solved], [s.iteration_s for s in solved], color=OTHER, s=18,
               label="plan of a budget level", zorder=2)
    points = front.points
    rents, times = [p.rent_per_hour for p in points], [p.iteration_s for p in points]
    ax.step(rents, times, where="post", color=FRONT, linewidth=1.5, zorder=3)
    ax.scatter(rents, times, color=FRONT, s=40, zorder=4, label="Pareto-optimal plan")
    _mark(ax, points, labels)
    _scales(ax, [s.rent_per_hour for s in solved], [s.iteration_s for s in solved])
    ax.set_xlabel("rent per hour")
    ax.set_ylabel("iteration time T (s)")
    ax.set_title(_title(problem, front), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.subplots_adjust(left=0.07, right=0.68, top=0.92, bottom=0.1)  # the key of rented GPUs on the right
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


WIDE = 8.0  # an axis whose figures span more than this factor is drawn in log scale


def _scales(ax, rents: list[float], times: list[float]) -> None:
    """Log axes where the figures span orders of magnitude (rents of 0 keep the rent axis linear)."""
    for values, axis, set_scale in ((times, ax.yaxis, ax.set_yscale), (rents, ax.xaxis, ax.set_xscale)):
        if values and min(values) > 0 and max(values) / min(values) > WIDE:
            set_scale("log")
            axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))  # 40, not 4×10^1
            axis.set_minor_formatter(FuncFormatter(lambda x, _: f"{x:g}"))


def _mark(ax, points, labels: list[str]) -> None:
    """Each point numbered beside it, with the GPUs it rents in a key right of the axes (labels
    inline would overlap where points crowd); the cheapest per token and the fastest ringed."""
    for i, p in enumerate(points, start=1):
        ax.annotate(str(i), (p.rent_per_hour, p.iteration_s), textcoords="offset points", xytext=(5, 5),
                    fontsize=8, fontweight="bold", color=FRONT)
    key = "\n".join(f"{i}. {label}\n    {p.rent_per_hour:,.2f}/h, T {format_seconds(p.iteration_s)}, "
                     f"{p.cost_per_mtok:.4g}/Mtok" for i, (p, label) in enumerate(zip(points, labels), start=1))
    ax.text(1.02, 1.0, key, transform=ax.transAxes, fontsize=7, va="top", ha="left", family="monospace")
    if not points:
        return
    cheapest = min(points, key=lambda p: (p.cost_per_mtok, p.iteration_s))
    fastest = min(points, key=lambda p: (p.iteration_s, p.rent_per_hour))
    ax.scatter([cheapest.rent_per_hour], [cheapest.iteration_s], s=160, facecolors="none", edgecolors=CHEAPEST,
               linewidths=2, zorder=5, label=f"cheapest per token ({cheapest.cost_per_mtok:.4g} per Mtok)")
    ax.scatter([fastest.rent_per_hour], [fastest.iteration_s], s=260, facecolors="none", edgecolors=FASTEST,
               linewidths=1.5, zorder=5, label="fastest")


def _title(problem, front) -> str:
    how = front.proof_phrase(short=True)
    return f"{problem.name}: time–rent frontier ({how})"
