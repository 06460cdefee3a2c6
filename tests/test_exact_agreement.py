"""CP-SAT, MILP and brute force agree on the optimal T (to 1e-6 relative, plus CP-SAT's
stated rounding bound) and on feasibility, over seeded random tiny problems: mixed GPU types,
uneven links, memory-tight and infeasible cases. Brute force is the independent oracle."""

from __future__ import annotations

import pytest

from exact_problems import random_problem
from planner.layered.pricing import iteration_time
from planner.solver_info import SolveStatus
from planner.layered.validate import validate
from solvers.common import SolverOptions
from solvers.layered.exact import brute, cpsat, milp

SEEDS = range(48)
OPTIONS = SolverOptions(time_limit_s=60)


def _problem(seed: int):
    # every third problem is bigger: up to 5 devices and 5 layers
    if seed % 3 == 2:
        return random_problem(seed, max_devices=5, max_layers=5, max_micro=4)
    return random_problem(seed)


@pytest.fixture(scope="module")
def oracle():
    return {seed: brute.solve(_problem(seed)) for seed in SEEDS}


def _rounding(result) -> float:
    """CP-SAT's stated bound on |model T − true T| (0 for the MILP), read from its message."""
    if "within" not in result.message:
        return 0.0
    return float(result.message.split("within ")[1].split(" s")[0])


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_solvers_match_brute_force(seed, oracle):
    problem, truth = _problem(seed), oracle[seed]
    for solver in (cpsat, milp):
        result = solver.solve(problem, OPTIONS)
        if truth.status == SolveStatus.infeasible:
            assert result.status == SolveStatus.infeasible, (solver.__name__, result)
            assert result.plan is None and result.message
            continue
        assert result.status == SolveStatus.optimal, (solver.__name__, result.message)
        assert not validate(problem, result.plan)
        t = iteration_time(problem, result.plan)
        assert result.objective_s == pytest.approx(t, rel=1e-12)
        slack = 1e-6 * truth.objective_s + _rounding(result)
        assert abs(t - truth.objective_s) <= slack, (solver.__name__, t, truth.objective_s)
        assert result.bound_s <= truth.objective_s + slack  # the bound is a real lower bound
        assert result.gap is not None and result.gap <= 1e-6 + _rounding(result) / t


def test_the_random_problems_exercise_every_case(oracle):
    """The seeds cover infeasible problems, several pipelines and several stages."""
    plans = [r.plan for r in oracle.values() if r.plan is not None]
    infeasible = sum(r.status == SolveStatus.infeasible for r in oracle.values())
    assert infeasible >= 5
    assert sum(len(p.pipelines) >= 2 for p in plans) >= 4
    assert sum(any(len(q.stages) >= 2 for q in p.pipelines) for p in plans) >= 10
    assert sum(any(s.tp >= 2 for q in p.pipelines for s in q.stages) for p in plans) >= 3
