"""Which terminal views show a plan: the module `hexiscale.cli.<kind>_views` of the plan's kind
(a registry by module name: a new plan kind brings its own module).

A views module defines `plan_table(problem, plan, estimate)`, `estimate_views(problem,
estimate, full)`, `solved_views(problem, plan, estimate)`, `plan_shape(plan)` (one line),
`timed_units(plan)` and `PREDICTION_TITLE` (the units a run record times, and the title of
their predicted-against-measured table), and `run_table(result, plan)` (the summary of a run);
optionally `simulated_step(problem, plan)` (a row more for that table: the layered kind's T
with its pipeline schedule simulated).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from rich.markup import escape

from planner.kinds import kind_of


def views_of(kind: str) -> ModuleType:
    """The views module of a plan kind (by the planner's kind name)."""
    return import_module(f"hexiscale.cli.{kind}_views")


def views_for(plan) -> ModuleType:
    """The views module of the plan's kind."""
    return views_of(kind_of(plan).name)


def plain(text) -> str:
    """A user's string (a problem, model, cluster, machine or GPU type name, a path, a message
    that quotes them) as it reads, wherever it enters rich markup: a table cell or title, a
    printed line. Unescaped, a machine named "[/]" stopped the command with a markup error and
    a model named "[bold red]m" printed as a red "m"."""
    return escape(str(text))
