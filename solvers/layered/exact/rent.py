"""The rent of a plan in the exact models (docs/formulation.md [C17]/[M18], docs/prices.md §13):
a binary rented_M per machine, at least every layout variable that puts a layer on M (a machine is
rented when any of its devices is used), and the budget Σ_M count_M·price_M·rented_M ≤ budget as
one linear constraint. Both families are empty without a budget.

CP-SAT needs integer coefficients: the rents and the budget are scaled by the least power of ten
that makes every rent a whole number (prices written with up to `MAX_DIGITS` decimals, the usual
case), which keeps "fits the budget" exactly the planner's test; rents with more decimals are
rounded up at that scale (the model may then miss a plan that spends the budget to the last
fraction, never admit one above it).
"""

from __future__ import annotations

import math

import numpy as np
import pulp

from planner.prices import fits_budget, rent_per_hour, spendable
from planner.problem import Problem

MAX_DIGITS = 6


def rent_units(rents: np.ndarray, budget: float) -> tuple[list[int], int]:
    """Integer rents and budget at the least power of ten that makes every rent whole (module text)."""
    for digits in range(MAX_DIGITS + 1):
        scaled = np.asarray(rents, dtype=float) * 10**digits
        if np.all(np.abs(scaled - np.rint(scaled)) <= 1e-6 * np.maximum(1.0, np.abs(scaled))):
            return [int(x) for x in np.rint(scaled)], math.floor(spendable(budget) * 10**digits)
    scale = 10**MAX_DIGITS
    return [math.ceil(x * scale) for x in rents], math.floor(spendable(budget) * scale)


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
