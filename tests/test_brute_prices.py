"""Brute force honours the objective (docs/prices.md §13) on both plan kinds: least T, least T
within the budget, least cost per token, and the time–rent Pareto frontier, on the seeded tiny
priced problems of instances/random_priced.py (the set the exact solvers are judged on).

Each answer is checked against what it must be from first principles: every frontier point's
plan is valid and the planner prices it at the point's rent and T; the frontier falls in T as
rent rises; the cheapest point per token, the fastest point within the budget and the fastest
point overall are the objective's answers (each lies on the frontier)."""

from __future__ import annotations

from functools import lru_cache

import pytest

from instances.random_priced import random_priced
from planner.kinds import evaluate, validate
from planner.prices import fits_budget, rent_per_hour
from planner.problem import Objective
from solvers.brute_objective import TIE, BrutePoint, brute_frontier, choose, pareto
from solvers.layered.exact import brute as layered_brute
from solvers.sequence import brute as sequence_brute
from planner.solver_info import SolveStatus

BRUTE = {"layered": layered_brute, "sequence": sequence_brute}
SEEDS = range(100)


@lru_cache(maxsize=None)
def case(kind: str, seed: int):
    problem = random_priced(seed, kind)
    return problem, BRUTE[kind].best_per_machine_set(problem)


def point(rent, t, machines=(0,)) -> BrutePoint:
    return BrutePoint(machines=machines, rent_per_hour=rent, iteration_s=t, cost_per_mtok=rent * t, plan=None)


def test_pareto_keeps_the_undominated_points_once():
    points = [point(1.0, 10.0), point(2.0, 10.0), point(2.0, 6.0), point(3.0, 7.0), point(0.1 + 0.2, 12.0),
              point(0.3, 12.0 * (1 + TIE / 10)), point(5.0, 5.0), point(5.0 * (1 + TIE / 10), 4.0)]
    kept = [(p.rent_per_hour, p.iteration_s) for p in pareto(points)]
    # (2, 10) and (3, 7) are dominated; the two 0.3-rent points are one; (5, 5) loses to a rent
    # equal within TIE that is faster
    assert kept == [(0.3, pytest.approx(12.0)), (1.0, 10.0), (2.0, 6.0), (5.0 * (1 + TIE / 10), 4.0)]


def test_the_generator_gives_every_objective_and_infeasible_budgets():
    problems = [random_priced(seed, "layered") for seed in SEEDS]
    assert all(p.cluster.priced and 2 <= len(p.cluster.machines) and p.cluster.num_devices <= 4 for p in problems)
    goals = {(p.objective, p.budget_per_hour is not None) for p in problems}
    assert goals == {(Objective.time, False), (Objective.time, True), (Objective.cost, False), (Objective.cost, True)}
    assert random_priced(7, "sequence").training.seq_len % (2 * random_priced(7, "sequence").training.token_block) == 0
    assert random_priced(3, "layered").model_dump() == random_priced(3, "layered").model_dump()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["layered", "sequence"])
def test_frontier_points_are_priced_plans_falling_in_t(kind):
    shapes = 0
    for seed in SEEDS:
        problem, points = case(kind, seed)
        front = brute_frontier(problem, points)
        for p in front:
            assert not validate(problem, p.plan)
            estimate = evaluate(problem, p.plan)
            assert estimate.rent_per_hour == pytest.approx(p.rent_per_hour)
            assert estimate.iteration_s == pytest.approx(p.iteration_s, rel=1e-9)
            assert fits_budget(problem, p.rent_per_hour)
        assert all(a.rent_per_hour < b.rent_per_hour and a.iteration_s > b.iteration_s
                   for a, b in zip(front, front[1:]))
        shapes += len(front) >= 2
    assert shapes >= 25  # the set is not only one-point frontiers


@pytest.mark.parametrize("kind", ["layered", "sequence"])
def test_objective_answers_are_the_frontiers_own(kind):
    statuses = set()
    for seed in SEEDS:
        problem, points = case(kind, seed)
        front, best = brute_frontier(problem, points), choose(problem, points)
        if not front:
            assert best is None
            continue
        if problem.objective == Objective.cost:
            want = min(front, key=lambda p: p.cost_per_mtok)
            assert best.cost_per_mtok == pytest.approx(want.cost_per_mtok, rel=1e-12)
            assert all(best.cost_per_mtok <= p.cost_per_mtok * (1 + 1e-12) for p in points if fits_budget(problem, p.rent_per_hour))
        else:
            assert best.iteration_s == pytest.approx(front[-1].iteration_s, rel=1e-12)
            assert all(best.iteration_s <= p.iteration_s * (1 + 1e-12) for p in points
                       if fits_budget(problem, p.rent_per_hour))
        statuses.add((problem.objective, problem.budget_per_hour is not None))
    assert len(statuses) == 4


@pytest.mark.parametrize("kind", ["layered", "sequence"])
def test_solve_returns_the_objectives_answer(kind):
    for seed in range(0, 100, 7):
        problem, points = case(kind, seed)
        result, best = BRUTE[kind].solve(problem), choose(problem, points)
        if best is None:
            assert result.status == SolveStatus.infeasible and result.plan is None
            if points:
                assert "within the budget" in result.message
            continue
        assert result.status == SolveStatus.optimal
        assert result.objective_s == pytest.approx(best.iteration_s, rel=1e-9)
        assert fits_budget(problem, rent_per_hour(problem, result.plan))
        assert (result.bound_s is None) == (problem.objective == Objective.cost)
        estimate = evaluate(problem, result.plan)
        assert estimate.cost_per_mtok == pytest.approx(best.cost_per_mtok, rel=1e-9)


@pytest.mark.parametrize("kind", ["layered", "sequence"])
def test_brute_frontier_function(kind):
    problem = random_priced(5, kind)  # 3 (layered) and 2 (sequence) frontier points
    front = BRUTE[kind].frontier(problem)
    assert len(front) >= 2 and all(not validate(problem, p.plan) for p in front)
    assert [p.rent_per_hour for p in front] == sorted(p.rent_per_hour for p in front)
