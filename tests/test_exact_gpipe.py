"""Under `schedule: gpipe` every micro-batch is in flight (q = m_p, docs/cost-model.md §3.5): CP-SAT,
MILP and an exhaustive oracle agree on status and T over seeded tiny problems, several of
them chosen because GPipe's memory changes the optimum (or makes the problem infeasible).

The oracle is brute force's enumeration of plans (a superset of the valid ones) kept only
where the planner's validator, which prices memory with the schedule, finds no violation:
correct by construction, whatever the enumeration assumes about q."""

from __future__ import annotations

import pytest

from exact_problems import random_problem
from planner.layered.pricing import iteration_time
from planner.layered.validate import validate
from planner.problem import Problem
from planner.solver_info import SolveStatus
from planner.workload import TrainingSpec
from solvers.common import SolverOptions
from solvers.layered.exact import brute, cpsat, milp

CHANGED = (12, 16, 22, 33, 38, 59)  # GPipe's memory changes the optimum or the feasibility
SAME = (0, 2, 8, 20)
OPTIONS = SolverOptions(time_limit_s=60)


def _problems(seed: int) -> tuple[Problem, Problem]:
    """(the 1F1B problem, the same problem under GPipe)."""
    if seed % 3 == 2:
        base = random_problem(seed, max_devices=5, max_layers=5, max_micro=6)
    else:
        base = random_problem(seed, max_micro=6)
    training = TrainingSpec(**{**base.training.model_dump(), "schedule": "gpipe"})
    return base, Problem(name=f"{base.name}-gpipe", cluster=base.cluster, model=base.model, training=training)


def _oracle(problem: Problem) -> float | None:
    """The least T over every enumerated plan that the validator accepts (None: infeasible)."""
    best = None
    for pipes in brute.enumerate_plans(problem):
        plan = brute.make_plan(problem, pipes)
        if not validate(problem, plan):
            t = iteration_time(problem, plan)
            best = t if best is None else min(best, t)
    return best


def _rounding(result) -> float:
    return float(result.message.split("within ")[1].split(" s")[0]) if "within" in result.message else 0.0


@pytest.mark.parametrize("seed", CHANGED + SAME)
def test_exact_models_match_the_oracle_under_gpipe(seed):
    _, problem = _problems(seed)
    truth = _oracle(problem)
    for solver in (cpsat, milp):
        result = solver.solve(problem, OPTIONS)
        if truth is None:
            assert result.status == SolveStatus.infeasible, (solver.__name__, result.message)
            assert result.plan is None
            continue
        assert result.status == SolveStatus.optimal, (solver.__name__, result.message)
        assert not validate(problem, result.plan)
        t = iteration_time(problem, result.plan)
        assert result.objective_s == pytest.approx(t, rel=1e-12)
        slack = 1e-6 * truth + _rounding(result)
        assert abs(t - truth) <= slack, (solver.__name__, t, truth)
        assert result.bound_s <= truth + slack


def test_the_gpipe_seeds_really_change_the_problem():
    """Each CHANGED seed has another optimum (or feasibility) than under 1F1B; SAME seeds not."""
    for seed in CHANGED + SAME:
        base, problem = _problems(seed)
        one_f_one_b = brute.solve(base)
        assert (one_f_one_b.objective_s != _oracle(problem)) == (seed in CHANGED), seed


@pytest.mark.parametrize("seed", CHANGED + SAME)
def test_brute_force_solver_matches_the_oracle_under_gpipe(seed):
    """brute.solve prunes by the most micro-batches a pipeline holds in memory; under GPipe
    that count is not flat from m = S on (it was, wrongly, before the schedule's q was used)."""
    _, problem = _problems(seed)
    truth, result = _oracle(problem), brute.solve(problem)
    if truth is None:
        assert result.status == SolveStatus.infeasible and result.plan is None
    else:
        assert result.status == SolveStatus.optimal and not validate(problem, result.plan)
        assert result.objective_s == pytest.approx(truth, rel=1e-12)
