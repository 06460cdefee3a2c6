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


def test_only_the_least_sets_bound_is_refined_and_the_larger_of_its_two_bounds_counts() -> None:
    """`refine_least` hands the set that holds the least bound to another solver (here one that
    proves the set's brute-force optimum), takes the larger of the two bounds, and moves on to
    the next least set until its time is spent or the least is refined; by_sets stays below
    brute force's optimum within the budget, and never falls."""
    from solvers.layered.bound.budget_sets import refine_least

    asked = []

    def brute_bound(restricted, seconds: float) -> float | None:
        asked.append(restricted.cluster.num_devices)
        found = brute.solve(restricted)
        return found.objective_s if found.status == SolveStatus.optimal else None

    raised = 0
    for seed in [seed for seed in BUDGETED if _by_sets(seed).sets and _by_sets(seed).by_sets < math.inf][:12]:
        before = _by_sets(seed)
        problem = random_priced(seed, "layered").model_copy(update={"objective": Objective.time})
        asked.clear()
        sets = refine_least(problem, list(before.sets), brute_bound, time.perf_counter() + 60, None)
        least = min(before.sets, key=lambda s: s.value)
        assert asked and asked[0] == sum(problem.cluster.machines[m].count for m in least.machines)
        assert all(s.value >= b.value for s, b in zip(sets, before.sets))
        refined = [s for s in sets if s.exact is not None]
        assert min(sets, key=lambda s: s.value).exact is not None  # the least set is a refined one
        assert len(refined) == len(asked)
        after = min(s.value for s in sets)
        optimum = _bounds(seed)[2]
        if optimum is not None:
            assert after <= optimum * (1 + 1e-9), f"seed {seed}: {after!r} > optimum {optimum!r}"
        raised += after > before.by_sets * (1 + 1e-6)
    assert raised >= 3, raised  # 9 of 12 when written


def test_sets_alike_up_to_machine_names_are_bounded_once() -> None:
    """Generated 64 GPUs seed 3 at 14.24/h lists 13 maximal sets; two pairs differ only in a
    link of one machine to a machine outside the set. `distinct_sets` keeps one of each pair,
    and the dropped set's restricted problem prices every stage, send and sync exactly as the
    kept one's does (the coefficient tables the bound reads, compared one by one)."""
    import sys
    from pathlib import Path

    import numpy as np

    from solvers import rental
    from solvers.frontier import at_budget

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_frontier import problem_named

    problem = at_budget(problem_named("gen64-s3"), 14.24)
    listed = maximal_sets_or_none(problem)
    kept = rental.distinct_sets(problem, listed)
    assert (len(listed), len(kept)) == (13, 11)
    from solvers.objective import machine_sets
    assert machine_sets(problem, 14.24, exact=True) == (kept, True)  # the exact path solves the 11, complete

    def figures(machines):
        tables = Tables(rental.restricted(problem, machines)[0])
        machines = range(tables.num_machines)
        return [tables.tau_layer, tables.tau_head, tables.pp_link, tables.pp_bcast,
                np.array([[tables.dp_bw_part(2, 1e9, 1, a, b) + tables.dp_lat_part(2, a, b) for b in machines]
                          for a in machines])]

    of_set = {machines: figures(machines) for machines in listed}  # each set's tables built once

    def alike(a, b) -> bool:
        return all(np.shape(x) == np.shape(y) and np.array_equal(x, y) for x, y in zip(of_set[a], of_set[b]))

    for dropped in set(listed) - set(kept):
        assert sum(alike(k, dropped) for k in kept) == 1, dropped
    assert not any(alike(a, b) for i, a in enumerate(kept) for b in kept[i + 1:])  # the kept ones all differ
