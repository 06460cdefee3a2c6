"""Exact solvers on bundled tiny problems and on hand-made edge cases: plans validate and
the evaluator's T equals the reported objective, infeasibility is explained with numbers,
hints are used, and limits that may cut the optimum are reported as restrictions."""

from __future__ import annotations

import pytest

from exact_problems import random_problem
from planner.base import GIB
from planner.hardware import Cluster, Machine
from planner.io import load_problem
from planner.solver_info import SolveStatus
from planner.problem import Problem
from planner.layered.pricing import iteration_time
from planner.layered.validate import validate
from planner.workload import ModelSpec, TrainingSpec
from solvers.common import SolverOptions
from solvers.layered.exact import brute, cpsat, milp
from solvers.layered.tables import Tables, explain_infeasible
from solvers.registry import solve

EXACT = (cpsat, milp)


@pytest.mark.parametrize("name", ["tiny-2-tiny", "tiny-4-tiny-mha", "tiny-6-tiny", "demo-tiny"])
@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_bundled_tiny_problems_are_solved_to_proven_optimality(name, solver):
    problem = load_problem(name)
    result = solve(problem, solver, SolverOptions(time_limit_s=60))
    assert result.status == SolveStatus.optimal
    assert validate(problem, result.plan) == []
    t = iteration_time(problem, result.plan)
    assert result.objective_s == pytest.approx(t, rel=1e-12)
    assert result.bound_s <= t * (1 + 1e-9)
    rounding = float(result.message.split("within ")[1].split(" s")[0]) if "within" in result.message else 0.0
    assert result.gap <= 1e-6 + rounding / t
    # a D is proved by its model or, before any model, by the combinatorial bound [B2]
    assert result.model_size.variables > 0 or "combinatorial bound" in result.message
    assert result.plan.solver.name == solver and result.plan.solver.status == SolveStatus.optimal


def test_tiny_bundled_optimum_matches_brute_force():
    problem = load_problem("tiny-4-tiny-mha")
    truth = brute.solve(problem).objective_s
    for solver in EXACT:
        assert solver.solve(problem).objective_s == pytest.approx(truth, rel=1e-6)


def _problem(cluster: Cluster, model: ModelSpec, **training) -> Problem:
    return Problem(name="edge", cluster=cluster, model=model,
                   training=TrainingSpec(seq_len=1024, global_batch=4, **training))


LLAMA_7B = ModelSpec(name="llama2-7b", layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000)


def test_too_little_memory_is_explained_with_totals():
    cluster = Cluster(machines=(Machine(name="a", gpu="A100-80G", count=1, intra_bw_gbps=100),
                                Machine(name="b", gpu="RTX4090", count=1, intra_bw_gbps=16)),
                      inter_bw_gbps=10)
    problem = _problem(cluster, LLAMA_7B)
    states = 16 * LLAMA_7B.total_params / GIB
    for solver in EXACT:
        result = solver.solve(problem)
        assert result.status == SolveStatus.infeasible and result.plan is None
        assert f"model states need {states:.1f} GiB" in result.message
        assert "the cluster has 100.0 GiB" in result.message  # (80 − 2) + (24 − 2)


def test_an_embedding_that_fits_nowhere_is_named():
    huge_vocab = ModelSpec(name="wide", layers=2, hidden=4096, heads=32, ffn_hidden=4096, vocab=2_000_000)
    cluster = Cluster(machines=tuple(Machine(name=f"m{i}", gpu="RTX4090", count=2, intra_bw_gbps=16)
                                     for i in range(8)), inter_bw_gbps=10)
    problem = _problem(cluster, huge_vocab)
    for solver in EXACT:
        result = solver.solve(problem)
        assert result.status == SolveStatus.infeasible
        assert "no stage fits layer 0 with its embedding" in result.message


def test_infeasibility_only_the_model_can_prove_is_reported_as_proven():
    """Every total looks fine, yet no pipeline fits: the models prove it (brute force agrees)."""
    seeds = [s for s in range(48) if brute.solve(random_problem(s)).status == SolveStatus.infeasible
             and not explain_infeasible(Tables(random_problem(s)))]
    assert seeds
    for seed in seeds[:3]:
        for solver in EXACT:
            result = solver.solve(random_problem(seed))
            assert result.status == SolveStatus.infeasible
            assert "proved by the model" in result.message and "GiB" in result.message


def _multi_pipeline_problem() -> Problem:
    """A seeded tiny problem whose optimum needs two or more pipelines."""
    for seed in range(48):
        problem = random_problem(seed)
        plan = brute.solve(problem).plan
        if plan is not None and len(plan.pipelines) >= 2:
            return problem
    raise AssertionError("no multi-pipeline optimum among the seeds")


def test_a_pipeline_limit_is_reported_and_respected():
    problem = _multi_pipeline_problem()
    free = brute.solve(problem).objective_s
    for solver in EXACT:
        result = solver.solve(problem, SolverOptions(max_pipelines=1))
        assert any("at most 1 pipeline " in r for r in result.restrictions)
        if result.plan is not None:
            assert len(result.plan.pipelines) == 1
            assert result.objective_s > free * (1 + 1e-9)  # the limit did cut the optimum here


def test_a_stage_limit_is_reported_and_respected():
    problem = load_problem("tiny-4-tiny-mha")
    for solver in EXACT:
        result = solver.solve(problem, SolverOptions(max_stages=1))
        assert any("at most 1 stage per pipeline" in r for r in result.restrictions)
        assert all(len(p.stages) == 1 for p in result.plan.pipelines)


def test_default_limits_are_not_restrictions():
    result = cpsat.solve(load_problem("tiny-2-tiny"))
    assert result.restrictions == ()


def test_an_optimal_hint_is_kept_and_proven():
    problem = _multi_pipeline_problem()
    truth = brute.solve(problem)
    for solver in EXACT:
        result = solver.solve(problem, SolverOptions(hint=truth.plan))
        assert result.status == SolveStatus.optimal
        assert result.objective_s == pytest.approx(truth.objective_s, rel=1e-6)


@pytest.mark.slow
def test_a_short_time_limit_on_a_larger_problem_reports_an_honest_gap():
    problem = load_problem("small-8-llama2-7b")
    for solver in EXACT:
        result = solver.solve(problem, SolverOptions(time_limit_s=4))
        assert result.status in (SolveStatus.optimal, SolveStatus.feasible)
        assert validate(problem, result.plan) == []
        assert result.objective_s == pytest.approx(iteration_time(problem, result.plan), rel=1e-12)
        assert 0 < result.bound_s <= result.objective_s
        if result.status == SolveStatus.feasible:
            assert "not proven" in result.message and result.gap > 0
