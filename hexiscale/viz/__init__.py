"""Pictures of a plan (matplotlib, PNG), drawn by its kind's module `hexiscale.viz.<kind>_drawing`
(a registry by module name: a new plan kind brings its own module). A layered plan: the
cluster graph with pipelines and stages, the cost model's pipeline timeline (§3.3 flow line)
as a Gantt chart, and per-device memory against capacity. A sequence plan (§7): its rings
(groups, token shares, heads per member, the mirrored token layout) and per-device time and
memory bars."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from types import ModuleType

from planner.kinds import kind_of
from planner.problem import Problem


def drawing_of(kind: str) -> ModuleType:
    """The drawing module of a plan kind (by the planner's kind name)."""
    return import_module(f"hexiscale.viz.{kind}_drawing")


def draw_plan(problem: Problem, plan, out_dir: str | Path, prefix: str = "",
              on_step=lambda what: None) -> list[Path]:
    """Write the plan's pictures into out_dir (PREFIX-NAME.png when a prefix is given):
    cluster.png, schedule.png and memory.png for a layered plan; ring.png and devices.png for
    a sequence plan. Returns the paths written."""
    return drawing_of(kind_of(plan).name).draw_plan(problem, plan, out_dir, prefix, on_step)
