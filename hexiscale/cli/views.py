"""Which terminal views show a plan: one module per plan kind, found by the plan's kind."""

from __future__ import annotations

from types import ModuleType

from hexiscale.cli import layered_views, sequence_views
from planner.kinds import kind_of

VIEWS: dict[str, ModuleType] = {"layered": layered_views, "sequence": sequence_views}


def views_for(plan) -> ModuleType:
    """The views module of the plan's kind: `plan_table`, `estimate_views`, `plan_shape`."""
    return VIEWS[kind_of(plan).name]
