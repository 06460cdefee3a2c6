"""Pictures of a sequence plan (docs/sequence-plans.md §7): its rings (groups, token shares, heads per
member, the mirrored token layout) and per-device time and memory bars.
`hexiscale.viz.draw_plan` picks this module for a sequence plan."""

from __future__ import annotations

from pathlib import Path

from hexiscale.viz.common import prepare
from planner.problem import Problem
from planner.sequence.plan import SeqPlan


def draw_plan(problem: Problem, plan: SeqPlan, out_dir: str | Path, prefix: str = "",
              on_step=lambda what: None) -> list[Path]:
    """ring.png (groups, token shares, heads, layout) and devices.png (time and memory bars)."""
    from hexiscale.viz.sequence_bars import draw_bars  # matplotlib only when drawing
    from hexiscale.viz.sequence_ring import draw_ring

    paths, estimate, title = prepare(problem, plan, out_dir, prefix, ("ring", "devices"), on_step)
    on_step(f"drawing {paths[0].name}")
    draw_ring(problem, plan, paths[0], title)
    on_step(f"drawing {paths[1].name}")
    draw_bars(problem, estimate, paths[1], title)
    return paths
