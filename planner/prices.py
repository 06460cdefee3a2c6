"""What a plan costs to rent (docs/prices.md §13), for plans of every kind.

A machine is rented when a plan uses any of its devices, and then costs count × price per hour
(whole machines are rented). rent(plan) = Σ over rented machines of count·price; the cost per
token is rent·T / (3600·B·s), B·s being the tokens of one iteration (both plan kinds train B
sequences of s tokens per iteration: §3.6 and §7.2 count B·s / T tokens per second).

Every function takes the plan's devices through `plan.devices` (a layered plan's stages, a
sequence plan's members), so this module needs no plan kind and the evaluators of every kind
can call it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from planner.problem import Objective, Problem

SECONDS_PER_HOUR = 3600.0
PER_MILLION = 1e6
# rent is a sum of floats; a plan that spends the budget exactly must not fail it by rounding
BUDGET_SLACK = 1e-9


def spendable(budget: float) -> float:
    """The most rent per hour `budget` admits: the budget and its rounding slack."""
    return budget * (1 + BUDGET_SLACK)


def cheaper_than(rent: float) -> float:
    """The rents below this are cheaper than `rent` by more than rounding."""
    return rent * (1 - BUDGET_SLACK)


def rented_machines(problem: Problem, devices: Iterable[int]) -> tuple[int, ...]:
    """The machines (indices, ascending) that hold any of `devices`: the ones a plan rents."""
    ids = np.asarray(devices if isinstance(devices, np.ndarray) else list(devices), dtype=np.int64)
    return tuple(np.unique(problem.cluster.machine_of_device[ids]).tolist())


def rent_of_devices(problem: Problem, devices: Iterable[int]) -> float | None:
    """Σ count·price per hour over the machines holding `devices`; None when the cluster has no
    prices on every machine (a rent that left out a machine would be wrong, not cheap)."""
    cluster = problem.cluster
    if not cluster.priced:
        return None
    rented = list(rented_machines(problem, devices))
    return float(cluster.machine_rent[rented].sum())


def rent_per_hour(problem: Problem, plan: Any) -> float | None:
    """What the plan's rented machines cost per hour (§13); None without prices."""
    return rent_of_devices(problem, plan.devices)


def tokens_per_iteration(problem: Problem) -> int:
    """B·s: the tokens of one training iteration (the same for every plan of the problem)."""
    return problem.training.global_batch * problem.training.seq_len


def cost_of(problem: Problem, rent: float | None, iteration_s: float) -> float | None:
    """Cost per million tokens of a plan renting `rent` per hour at iteration time T:
    rent·T / (3600·B·s) · 1e6; None without a rent."""
    if rent is None:
        return None
    return rent * iteration_s / (SECONDS_PER_HOUR * tokens_per_iteration(problem)) * PER_MILLION


def cost_per_mtok(problem: Problem, plan: Any, iteration_s: float) -> float | None:
    """The plan's cost per million tokens at iteration time `iteration_s` (§13); None without prices."""
    return cost_of(problem, rent_per_hour(problem, plan), iteration_s)


def objective_value(problem: Problem, plan: Any, iteration_s: float) -> float:
    """What the problem's objective minimizes for this plan: T (objective time, with or without
    a budget), or the cost per million tokens (objective cost)."""
    if problem.objective == Objective.time:
        return iteration_s
    cost = cost_per_mtok(problem, plan, iteration_s)
    if cost is None:  # Problem's validator refuses the cost objective without prices
        raise ValueError(f"problem {problem.name!r}: objective cost needs a price on every machine")
    return cost


def fits_budget(problem: Problem, rent: float | None) -> bool:
    """Whether a rent per hour is within the problem's budget (always, without a budget)."""
    budget = problem.budget_per_hour
    if budget is None:
        return True
    if rent is None:  # Problem's validator refuses a budget without prices
        raise ValueError(f"problem {problem.name!r}: budget_per_hour needs a price on every machine")
    return rent <= spendable(budget)


def within_budget(problem: Problem, plan: Any) -> bool:
    """Whether the plan's rent is within the problem's budget per hour (always, without a budget)."""
    return problem.budget_per_hour is None or fits_budget(problem, rent_per_hour(problem, plan))
