"""What every kind's pictures share: the title line and where the files go."""

from __future__ import annotations

from pathlib import Path

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

