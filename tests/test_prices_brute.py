"""The exact solvers' prices against brute force (docs/prices.md §13), on 100 tiny priced problems of
each plan kind (instances/random_priced.py: every objective, budgets that some plans miss and some
that every plan misses): each objective's exact answer is brute force's — the least T (within the
budget), or the least cost per token — with its rent, T and cost per million tokens; and every
point of the exact time–rent frontier is a point of brute force's, none missing.

Brute force (`solvers/brute_objective.py`) keeps the least-T plan of every rented machine set and
shares no code with the exact models or `solvers.frontier`."""

from __future__ import annotations

import math
from functools import lru_cache

import pytest

from instances.random_priced import random_priced
from planner.kinds import evaluate
from planner.prices import fits_budget
from planner.problem import Objective
from planner.solver_info import SolveStatus
from solvers import frontier as frontiers
from solvers.brute_objective import BrutePoint, brute_frontier, choose
from solvers.common import SolverOptions
from solvers.layered.exact import brute as layered_brute
from solvers.registry import get
from solvers.sequence import brute as sequence_brute

pytestmark = pytest.mark.slow  # 100 (CP-SAT) and 40 (MILP) problems × 2 kinds, each solved and its frontier traced

# CP-SAT on all 100 per kind, as two tests of 50 (even and odd seeds; each half covers every
# kind of answer) so that the suite's workers share them; the MILP (a second exact model, checked
# against CP-SAT on every kind elsewhere) on 40, for the suite's time budget
SEEDS = {"cpsat-even": range(0, 100, 2), "cpsat-odd": range(1, 100, 2), "milp": range(40)}
BRUTE = {"layered": layered_brute, "sequence": sequence_brute}
REL = 1e-6  # the exact models' T is the evaluator's; ties in brute force are within 1e-9


@lru_cache(maxsize=None)
def brute_points(kind: str, seed: int) -> list[BrutePoint]:
    return BRUTE[kind].best_per_machine_set(random_priced(seed, kind))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def check_answer(problem, points: list[BrutePoint], result) -> str:
    """The exact result against brute force's answer; returns what kind of answer it was."""
    best = choose(problem, points)
    if best is None:
        assert result.plan is None and result.status == SolveStatus.infeasible, (problem.name, result)
        return "infeasible"
    assert result.status == SolveStatus.optimal, (problem.name, result.status, result.message)
    est = evaluate(problem, result.plan)
    assert fits_budget(problem, est.rent_per_hour), problem.name
    assert close(result.objective_s, est.iteration_s), problem.name
    if problem.objective == Objective.cost:
        assert close(est.cost_per_mtok, best.cost_per_mtok), (problem.name, est.cost_per_mtok, best.cost_per_mtok)
        tied = [p for p in points if fits_budget(problem, p.rent_per_hour) and close(p.cost_per_mtok, best.cost_per_mtok)]
    else:
        assert close(est.iteration_s, best.iteration_s), (problem.name, est.iteration_s, best.iteration_s)
        tied = [p for p in points if fits_budget(problem, p.rent_per_hour) and close(p.iteration_s, best.iteration_s)]
    # the rent and T of the answer are those of a brute-force plan as good (ties keep any of them)
    assert any(close(est.rent_per_hour, p.rent_per_hour) and close(est.iteration_s, p.iteration_s) for p in tied), \
        (problem.name, est.rent_per_hour, est.iteration_s, [(p.rent_per_hour, p.iteration_s) for p in tied])
    return f"{problem.objective.value}{'+budget' if problem.budget_per_hour is not None else ''}"


def check_frontier(problem, points: list[BrutePoint], front) -> int:
    """Every exact frontier point is brute force's, in order, none missing; returns their number."""
    expected = brute_frontier(problem, points)
    assert front.exact and front.proven, problem.name
    got = [(p.rent_per_hour, p.iteration_s, p.cost_per_mtok) for p in front.points]
    want = [(p.rent_per_hour, p.iteration_s, p.cost_per_mtok) for p in expected]
    assert len(got) == len(want), (problem.name, got, want)
    for (r, t, c), (r0, t0, c0) in zip(got, want):
        assert close(r, r0) and close(t, t0) and close(c, c0), (problem.name, got, want)
    for p in front.points:  # each point's plan is what the point says
        est = evaluate(problem, p.plan)
        assert close(est.rent_per_hour, p.rent_per_hour) and close(est.iteration_s, p.iteration_s)
    return len(got)


@pytest.mark.parametrize("seeds", [pytest.param(name, marks=pytest.mark.exhaustive) if name == "cpsat-odd" else name
                                   for name in SEEDS])  # `make test`: 50 CP-SAT + 40 MILP per kind
@pytest.mark.parametrize("kind", ["layered", "sequence"])
def test_exact_answers_and_frontiers_equal_brute_force(kind, seeds):
    answers, points_seen, solver = {}, 0, seeds.split("-")[0]
    for seed in SEEDS[seeds]:
        problem, points = random_priced(seed, kind), brute_points(kind, seed)
        result = get(solver, kind)(problem, SolverOptions(time_limit_s=60))
        what = check_answer(problem, points, result)
        answers[what] = answers.get(what, 0) + 1
        front = frontiers.frontier(problem, get(solver, kind), exact=True, time_limit_s=120)
        points_seen += check_frontier(problem, points, front)
    # the problems cover every objective, infeasible budgets and many frontier points
    assert {"time", "time+budget", "cost", "cost+budget", "infeasible"} <= set(answers), answers
    assert points_seen >= len(SEEDS[seeds]), points_seen  # frontiers of several points, not one each
