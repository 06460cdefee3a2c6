"""The figures every estimate leads with, whatever the plan's kind: T, throughput, MFU and,
with prices, rent and cost per token (docs/cost-model.md; §13 for the prices). Each kind's
estimate extends it with its own parts; `planner.kinds.headline` computes it alone."""

from __future__ import annotations

from pydantic import Field

from planner.base import Frozen


class Headline(Frozen):
    """The figures of a plan that a table of plans shows."""

    iteration_s: float = Field(gt=0, description="T = the slowest pipeline or replica + T_dp, seconds per iteration")
    tokens_per_s: float = Field(gt=0, description="B·s / T")
    mfu: float = Field(gt=0, description="F_iter / (T · Σ peak)")
    rent_per_hour: float | None = Field(
        default=None, ge=0, description="Σ count·price of the machines the plan rents (§13); None without prices")
    cost_per_mtok: float | None = Field(
        default=None, ge=0, description="cost per million tokens, rent·T / (3600·B·s)·1e6; None without prices")
