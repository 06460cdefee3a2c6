"""What every kind's pictures share: the title line, where the files go, and per-device bars."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from planner.base import format_seconds
from planner.kinds import evaluate
from planner.problem import Problem


def plan_title(problem: Problem, plan, estimate) -> str:
    solver = f" — {plan.solver.name}" if plan.solver else ""
    return f"{problem.name}{solver}: T = {format_seconds(estimate.iteration_s)}, MFU {estimate.mfu:.1%}"


def picture_paths(out_dir: str | Path, prefix: str, names: tuple[str, ...]) -> list[Path]:
    """out_dir/PREFIX-NAME.png for each name (out_dir made if missing); "cs" → cs-cluster.png,
    a prefix already ending in -, _ or . is used as it is."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix}-" if prefix and prefix[-1] not in "-_." else prefix
    return [out / f"{stem}{name}.png" for name in names]


def prepare(problem: Problem, plan, out_dir: str | Path, prefix: str, names: tuple[str, ...],
            on_step) -> tuple[list[Path], object, str]:
    """What every kind's drawing starts from: the picture paths (`picture_paths`), the plan's
    estimate and the title line."""
    paths = picture_paths(out_dir, prefix, names)
    on_step("pricing the plan")
    estimate = evaluate(problem, plan)
    return paths, estimate, plan_title(problem, plan, estimate)


BAR_DEVICES = 256  # above this many devices a bar is under a pixel wide: steps, not 10^3 patches


def stacked_bars(ax, x: np.ndarray, values: dict[str, np.ndarray], parts) -> None:
    """`parts` ((name, colour), ...) stacked per device: bars, or for many devices the same stack
    as filled steps (one polygon per part; 4·10^3 bar patches took ~10 s to draw, 10^5 minutes)."""
    bottom = np.zeros(len(x))
    for part, shade in parts:
        label = part.replace("_", " ")
        if len(x) <= BAR_DEVICES:
            ax.bar(x, values[part], bottom=bottom, color=shade, label=label, width=0.8, gid=part)
        else:
            ax.fill_between(x, bottom, bottom + values[part], step="mid", color=shade, label=label, linewidth=0,
                            gid=part)
        bottom = bottom + values[part]


def device_strip(ax, x: np.ndarray, colours: list, y: float, height: float) -> None:
    """A strip under the bars, one cell per device in its colour (one collection of cells)."""
    ax.broken_barh([(d - 0.5, 1.0) for d in x.tolist()], (y, height), facecolors=colours)


TEXT_MARGIN_IN = 0.8  # the y axis's labels left of a title or label that starts at the axes


def wrapped(text: str, width_in: float, fontsize: float = 10) -> str:
    """`text` broken at spaces into lines that fit `width_in` inches at `fontsize` points (DejaVu
    Sans averages about 0.6 em a character), each of its own lines apart: the titles and labels
    of a figure of few devices ran past its edge and were cut ("(smallest headroo")."""
    chars = max(16, int(width_in * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))
