"""The configuration bound under a budget (docs/bounds.md [U6]): the integer test also rents
whole machines per class within `budget_per_hour`. On the seeded tiny priced problems that
carry a budget (instances/random_priced.py), the bound never exceeds brute force's optimum
within the budget, and it is above the bound of the same problem without the budget on
most of them (the constraint acts: a budget that rents half the cluster halves its compute).
"""

from __future__ import annotations

import math
import time
from functools import lru_cache

import pytest

from instances.random_priced import random_priced
from planner.problem import Objective
from planner.solver_info import SolveStatus
from solvers.layered.bound.budget_sets import (BudgetBound, budget_bound, maximal_sets_or_none, on_usage_route,
                                               set_tables)
from solvers.layered.bound.integer import Rent
from solvers.layered.bound.classes import class_types
from solvers.layered.bound.search import RELATIVE_TOLERANCE, configuration_bound
from solvers.layered.exact import brute
from solvers.layered.tables import Tables

BUDGETED = [seed for seed in range(100) if random_priced(seed, "layered").budget_per_hour is not None]


@lru_cache(maxsize=None)
def _bounds(seed: int) -> tuple[float, float, float | None]:
    """(bound within the budget, bound without it, brute force's optimum within it or None)."""
    problem = random_priced(seed, "layered").model_copy(update={"objective": Objective.time})
    free = problem.model_copy(update={"budget_per_hour": None})
    d_values = list(range(1, Tables(problem).max_pipelines + 1))
    within = configuration_bound(Tables(problem), None, d_values, float("inf")).value
    without = configuration_bound(Tables(free), None, d_values, float("inf")).value
    exact = brute.solve(problem)
    return within, without, exact.objective_s if exact.status == SolveStatus.optimal else None


@pytest.mark.parametrize("seed", BUDGETED)
def test_the_budgeted_bound_never_exceeds_the_optimum_within_the_budget(seed: int) -> None:
    within, without, optimum = _bounds(seed)
    # each bound is its bisection's last refuted threshold, within RELATIVE_TOLERANCE of where its
    # own test stops refuting; the budget may only move that point up
    assert within >= without * (1 - RELATIVE_TOLERANCE), f"seed {seed}: the budget lowered the bound"
    if optimum is not None:
        assert within <= optimum * (1 + 1e-9), f"seed {seed}: bound {within!r} > optimum {optimum!r}"


def test_the_budget_raises_the_bound_on_most_problems() -> None:
    raised = [seed for seed in BUDGETED if _bounds(seed)[0] > _bounds(seed)[1] * (1 + 1e-6)]
    assert len(BUDGETED) >= 30 and len(raised) >= 0.8 * len(BUDGETED), (len(raised), len(BUDGETED))


def test_rent_per_class_is_the_cheapest_machine_and_the_largest_size() -> None:
    """[U6]'s figures per class: y_k machines of class k hold at most y_k·(largest size) devices
    and cost at least y_k·(least rent); no budget, no rent."""
    problem = random_priced(next(s for s in BUDGETED), "layered")
    tables = Tables(problem)
    types = class_types(tables, 1)
    rent = Rent.of(types, problem.budget_per_hour)
    cluster = problem.cluster
    for k in range(len(types.devices)):
        members = [m for m in range(len(cluster.machines)) if types.class_of_machine[m] == k]
        assert rent.least_rent[k] == min(cluster.machine_rent[m] for m in members)
        assert rent.size[k] == max(cluster.machines[m].count for m in members)
        assert rent.machines[k] == len(members)
    assert Rent.of(types, None) is None


@lru_cache(maxsize=None)
def _by_sets(seed: int) -> BudgetBound:
    problem = random_priced(seed, "layered").model_copy(update={"objective": Objective.time})
    return budget_bound(problem, None, float("inf"))


@pytest.mark.parametrize("seed", BUDGETED)
def test_the_bound_by_machine_sets_never_exceeds_the_optimum_within_the_budget(seed: int) -> None:
    """[P8]: every plan within the budget lies in a maximal affordable set, so the least of the
    sets' own bounds, and its maximum with the whole problem's budgeted bound, stay below brute
    force's optimum within the budget (which shares no code with either)."""
    found, optimum = _by_sets(seed), _bounds(seed)[2]
    assert found.value >= found.whole.value
    if optimum is not None:
        assert found.value <= optimum * (1 + 1e-9), f"seed {seed}: {found.value!r} > optimum {optimum!r}"
        assert found.by_sets is None or found.by_sets <= optimum * (1 + 1e-9)


def test_the_sets_raise_the_bound_where_the_whole_problems_route_is_weaker() -> None:
    listed = [seed for seed in BUDGETED if _by_sets(seed).sets]
    raised = [seed for seed in listed if _by_sets(seed).by_sets > _by_sets(seed).whole.value * (1 + 1e-6)]
    assert len(listed) >= 30 and len(raised) >= 10, (len(listed), len(raised))  # 41 and 12 when written


def test_sets_that_would_take_the_lp_route_leave_their_time_to_the_whole_problem() -> None:
    """A set whose usage tables do not fit the sets' time would be bounded by the LP route, no
    stronger than the whole menu's budgeted LP where measured: then the sets are skipped and
    the whole problem's bound gets all the time (docs/bounds.md §4b)."""
    seed = next(seed for seed in BUDGETED if _by_sets(seed).sets)
    problem = random_priced(seed, "layered").model_copy(update={"objective": Objective.time})
    per_set = [set_tables(problem, machines) for machines in maximal_sets_or_none(problem)]
    assert any(t is not None for t in per_set)
    assert on_usage_route(per_set, None, math.inf) and not on_usage_route(per_set, None, 0.0)
    rushed = budget_bound(problem, None, time.perf_counter())
    assert rushed.sets == () and rushed.value == rushed.whole.value


def test_a_set_the_deadline_cut_is_searched_again_and_one_that_ended_before_it_is_not(monkeypatch) -> None:
    """`bound_sets`' second pass takes exactly the sets whose first search the deadline cut: a set
    whose search ended by itself is settled (more time would not raise it)."""
    from solvers.layered.bound import budget_sets

    seed = next(seed for seed in BUDGETED if _by_sets(seed).sets)
    problem = random_priced(seed, "layered").model_copy(update={"objective": Objective.time})
    sets = maximal_sets_or_none(problem)
    per_set = [set_tables(problem, machines) for machines in sets]
    searched = []
    real = budget_sets.set_bound

    def counted(machines, tables, incumbent, deadline):
        searched.append(real(machines, tables, incumbent, deadline))
        return searched[-1]

    monkeypatch.setattr(budget_sets, "set_bound", counted)
    for end in (math.inf, time.perf_counter() + 0.02):
        searched.clear()
        budget_sets.bound_sets(sets, per_set, None, end)
        first, second = searched[:len(sets)], searched[len(sets):]
        assert [b.machines for b in first] == list(sets)
        cut = sorted(b.machines for b in first if b.bound is not None and not b.settled)
        assert sorted(b.machines for b in second) == cut
        assert end < math.inf or not cut  # without a deadline every search ends by itself
    assert not real(sets[0], per_set[0], None, time.perf_counter() - 1).settled or per_set[0] is None
