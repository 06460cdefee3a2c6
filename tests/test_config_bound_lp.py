"""The configuration bound's LP route (docs/bounds.md §3, [P5]–[P7]), which large clusters take
when the usage tables do not fit: forced here on tiny problems, where brute force judges it.

- One certificate over a range of D ([P6]) never refutes a threshold that some plan with a D
  in the range reaches: checked on every range of every tiny problem against brute force's
  best plan per D (`brute.enumerate_plans`, which shares no code with the bound).
- The whole route (ranges split down to one D) never exceeds brute force's optimum, with and
  without a budget ([P5]: the budget row of the master; [P7]: D pipelines' least rent), and
  the budget row and the rent check raise it on some budgeted problems.
"""

from __future__ import annotations

from functools import lru_cache
from unittest.mock import patch

import numpy as np
import pytest

from instances.random_priced import random_priced
from instances.random_small import random_small
from planner.layered.pricing import iteration_time
from planner.problem import Objective
from solvers.layered.bound import master, search
from solvers.layered.bound.search import RELATIVE_TOLERANCE, DBound, DRange, configuration_bound
from solvers.layered.exact import brute
from solvers.layered.tables import Tables

SEEDS = [seed for seed in range(0, 80) if seed not in {43, 46, 66}]  # brute force 3.5–7.7 s on those
BUDGETED = [seed for seed in range(100) if random_priced(seed, "layered").budget_per_hour is not None]


def lp_bound(problem) -> float:
    """The bound over every D with the usage tables refused (the LP route of large clusters)."""
    tables = Tables(problem)
    with patch.object(search, "_usage_route", lambda *args, **kwargs: None):
        bound = configuration_bound(tables, None, list(range(1, tables.max_pipelines + 1)), float("inf"))
    assert bound.complete
    return bound.value


@lru_cache(maxsize=None)
def best_per_d(seed: int) -> dict[int, float]:
    """Brute force's least T per number of pipelines D (the feasible D only)."""
    problem = random_small(seed, tiny=True)
    best: dict[int, float] = {}
    for pipes in brute.enumerate_plans(problem):
        d = len(pipes)
        best[d] = min(best.get(d, float("inf")), iteration_time(problem, brute.make_plan(problem, pipes)))
    return best


@pytest.mark.parametrize("seed", SEEDS)
def test_a_range_certificate_never_refutes_a_plan_of_its_ds(seed: int) -> None:
    problem = random_small(seed, tiny=True)
    tables = Tables(problem)
    d_values = list(range(1, tables.max_pipelines + 1))
    optimum = best_per_d(seed)
    for lo in range(len(d_values)):
        for hi in range(lo, len(d_values)):
            reached = [optimum[d] for d in d_values[lo:hi + 1] if d in optimum]
            if not reached:
                continue
            leaf = DRange(lo, hi, DBound(0))
            search._bisect(leaf.test(tables, d_values), leaf.bound, tables.trivial_bound, 2 * min(reached), float("inf"))
            assert leaf.bound.refuted <= min(reached) * (1 + 1e-9), (
                f"seed {seed}: D={d_values[lo]}..{d_values[hi]} refuted {leaf.bound.refuted!r} > {min(reached)!r}")


@pytest.mark.parametrize("seed", SEEDS)
def test_the_lp_route_never_exceeds_the_optimum(seed: int) -> None:
    optimum = best_per_d(seed)
    if optimum:
        value = lp_bound(random_small(seed, tiny=True))
        assert value <= min(optimum.values()) * (1 + 1e-9)


@lru_cache(maxsize=None)
def _budgeted(seed: int) -> tuple[float, float, float | None]:
    """(LP bound within the budget, without it, brute force's optimum within it or None)."""
    problem = random_priced(seed, "layered").model_copy(update={"objective": Objective.time})
    exact = brute.solve(problem)
    return (lp_bound(problem), lp_bound(problem.model_copy(update={"budget_per_hour": None})),
            exact.objective_s if exact.plan is not None else None)


@pytest.mark.parametrize("seed", BUDGETED)
def test_the_lp_route_under_a_budget_never_exceeds_the_optimum_within_it(seed: int) -> None:
    within, without, optimum = _budgeted(seed)
    assert within >= without * (1 - RELATIVE_TOLERANCE)
    if optimum is not None:
        assert within <= optimum * (1 + 1e-9), f"seed {seed}: bound {within!r} > optimum {optimum!r}"


def test_the_budget_row_and_rent_check_raise_the_lp_bound() -> None:
    """Without the master's budget row and [P7]'s rent check (the class limits of [U6] kept),
    the bound is never higher, and lower on some budgeted problems (5 of 46 when written)."""
    without_row = []
    for seed in BUDGETED:
        problem = random_priced(seed, "layered").model_copy(update={"objective": Objective.time})
        with patch.object(master.Master, "device_price", property(lambda self: None)):
            without_row.append(lp_bound(problem))
    within = [_budgeted(seed)[0] for seed in BUDGETED]
    assert all(a >= b * (1 - RELATIVE_TOLERANCE) for a, b in zip(within, without_row))
    assert sum(a > b * (1 + 1e-6) for a, b in zip(within, without_row)) >= 4


def test_a_range_that_refutes_the_incumbents_own_d_is_refused(monkeypatch) -> None:
    """On the LP route too, a broken certificate (every threshold 'refuted') is an error, not a
    bound: the range holding the incumbent's D contradicts the incumbent."""
    seed = next(s for s in SEEDS if len(best_per_d(s)) > 1 and Tables(random_small(s, tiny=True)).max_pipelines > 2)
    tables = Tables(random_small(seed, tiny=True))
    optimum = best_per_d(seed)
    d = max(optimum)  # ≥ 2: in the first range [2, D_max]
    monkeypatch.setattr(search, "_usage_route", lambda *args, **kwargs: None)
    monkeypatch.setattr(master.Master, "refuted", lambda self, v: True)
    with pytest.raises(search.CertificateContradiction, match=r"D=\d+\.\.\d+ refuted .* the certificate is wrong"):
        configuration_bound(tables, optimum[d], list(range(1, tables.max_pipelines + 1)), float("inf"), first_d=d)


def test_the_master_seats_exactly_d_pipelines_and_its_duals_price_that() -> None:
    """A pool of a 4-device column of 10 micro-batches and a 1-device column of 1, 8 devices, D = 4:
    held as Σ x ≤ 4 the LP takes two big pipelines (20, the pipeline row's dual 0); a plan has
    exactly 4, so the master takes 4/3 big and 8/3 small ones: 16, with π = 3 per device and the
    pipeline row's dual −2, and π·N + D·ρ = 16 (LP duality)."""
    big = master.Column(usage=(4,), bubble=1.0, steady=0.1, stages=((0, 2),))
    small = master.Column(usage=(1,), bubble=1.0, steady=1.0, stages=((1, 2),))
    value, duals = master._lp([(big, 10), (small, 1)], np.array([8]), (4, 4), None, None)
    assert value == pytest.approx(16.0)
    assert duals[0] == pytest.approx(3.0) and duals[1] == pytest.approx(-2.0)
    assert duals[0] * 8 + 4 * duals[1] == pytest.approx(value)
    loose, _ = master._lp([(big, 10), (small, 1)], np.array([8]), (0, 4), None, None)
    assert loose == pytest.approx(20.0)


def test_the_equal_pipeline_row_never_lowers_the_lp_bound_and_raises_it_on_some() -> None:
    """With the master's pipeline row back at Σ x ≤ D alone (its dual ≥ 0), the route's bound is
    never higher on the tiny problems than with the row as a plan has it, and lower on some (1 of
    these 30 when written, 2 of 123 tiny and budgeted problems; the 128-GPU rows gain most,
    benchmarks/report/bounds.md)."""
    original = master._lp

    def loose(kept, devices, pipelines, rate, budget):
        return original(kept, devices, (0, pipelines[1]), rate, budget)

    pairs = []
    for seed in SEEDS[:30]:
        problem = random_small(seed, tiny=True)
        with patch.object(master, "_lp", loose):
            before = lp_bound(problem)
        pairs.append((lp_bound(problem), before))
    assert all(now >= before * (1 - RELATIVE_TOLERANCE) for now, before in pairs)
    assert sum(now > before * (1 + 1e-6) for now, before in pairs) >= 1


def test_past_its_deadline_the_master_refutes_nothing_more() -> None:
    """Column generation stops at the route's deadline (1,024 GPUs ran 13 s of a 5 s solve in
    its rounds): past it a threshold is refuted only by the checks that need no LP, never by
    more than in time; and on some problems the LP's refutation is then lost (a weaker bound)."""
    from solvers.layered.bound.classes import class_types

    lost = 0
    for seed in SEEDS[:20]:
        if not best_per_d(seed):
            continue  # no plan at all
        tables, best = Tables(random_small(seed, tiny=True)), min(best_per_d(seed).values())
        for d in range(1, tables.max_pipelines + 1):
            types = class_types(tables, d)
            for v in (0.9 * best, 0.99 * best):
                in_time, late = master.Master(types).refuted(v), master.Master(types, deadline=0.0).refuted(v)
                assert in_time or not late
                lost += in_time and not late
    assert lost > 0
