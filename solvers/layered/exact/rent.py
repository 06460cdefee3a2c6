"""The rent of a plan in the exact models (docs/formulation.md [C17]/[M18], docs/prices.md §13):
a binary rented_M per machine, at least every layout variable that puts a layer on M (a machine is
rented when any of its devices is used), and the budget Σ_M count_M·price_M·rented_M ≤ budget as
one linear constraint. Both families are empty without a budget.

CP-SAT needs integer coefficients: the rents are rounded up and the spendable budget down
(`planner.prices.spendable`: the budget and its 1e-9 rounding slack) at a scale S large enough
that the n roundings, under n units, stay inside a quarter of that slack. So every machine set
within the budget is admitted, every set above `spendable` refused, as the planner's own test
(`fits_budget`) decides; only a set whose rent lies in the slack's last quarter (rounding noise)
may be decided the other way. A machine dearer than `spendable` alone weighs cap + 1. (A scale by
the prices' decimals, as before, took 4.10958904109589 for whole at 10^5 and refused the set that
spent the budget exactly, while calling the worse plan optimal.)
"""

from __future__ import annotations

import math

import numpy as np
import pulp

from planner.prices import BUDGET_SLACK, fits_budget, rent_per_hour, spendable
from planner.problem import Problem


def rent_units(rents: np.ndarray, budget: float) -> tuple[list[int], int]:
    """Integer rents and budget that decide "within the budget" as `fits_budget` does (module text)."""
    rents = [float(r) for r in np.asarray(rents, dtype=float)]
    scale = 10 ** math.ceil(math.log10(4 * (len(rents) + 1) / (budget * BUDGET_SLACK)))
    cap = math.floor(spendable(budget) * scale)
    return [math.ceil(r * scale) if r <= spendable(budget) else cap + 1 for r in rents], cap


def cpsat_rent(builder, z: dict) -> dict:
    """[C17] rented_M ⇐ z[p, ℓ, c] for every stage type c on M; Σ rent_M·rented_M ≤ budget."""
    tb = builder.tb
    if tb.budget is None:
        return {}
    weights, cap = rent_units(tb.cluster.machine_rent, tb.budget)
    rented = {k: builder.model.new_bool_var(f"rented_{k}") for k in range(tb.num_machines)}
    for (p, l, c), zv in z.items():
        builder.model.add_implication(zv, rented[tb.types[c].machine])
    builder.model.add(sum(w * rented[k] for k, w in enumerate(weights)) <= cap)
    return rented


def milp_rent(builder, z: dict) -> dict:
    """[M18] rented_M ≥ Σ_{c on M} z[p, ℓ, c] for every p, ℓ; Σ rent_M·rented_M ≤ budget."""
    tb = builder.tb
    if tb.budget is None:
        return {}
    rented = {k: builder.bin(f"rented_{k}") for k in builder.K}
    for p in builder.P:
        for l in builder.L:
            for k in builder.K:
                builder.add(builder.on_machine(z, p, l, k) <= rented[k])
    rents = tb.cluster.machine_rent
    builder.add(pulp.lpSum(float(rents[k]) * rented[k] for k in builder.K) <= spendable(tb.budget))
    return rented


def over_budget(problem: Problem, plan) -> str:
    """Why a model's plan breaks the budget ('' when it keeps it): a bug in [C17]/[M18]."""
    if problem.budget_per_hour is None:
        return ""
    rent = rent_per_hour(problem, plan)
    if fits_budget(problem, rent):
        return ""
    return f"rent {rent!r} per hour exceeds the budget {problem.budget_per_hour!r}"
