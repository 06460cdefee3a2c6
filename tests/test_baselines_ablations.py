"""The random-partition baseline and the heuristic's ablations: reachable by name, valid,
each with exactly the restriction its name promises."""

from __future__ import annotations

import pytest

import hexiscale as hx
from planner.layered.pricing import iteration_time
from planner.io import load_problem
from solvers.common import SolverOptions
from solvers.layered.heuristic import HeuristicOptions, solve_with

OPTIONS = SolverOptions(time_limit_s=10, seed=0)
BASELINES = ["symmetric", "symmetric-all", "random", "ablation-one-tp", "ablation-equal-batch"]


@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_is_reachable_by_name_and_judged_by_the_evaluator(name):
    problem = load_problem("small-8-llama2-7b")
    result = hx.solve(problem, solver=name, options=OPTIONS)
    assert result.solver == name and result.plan is not None
    assert result.plan.solver.name == name
    assert hx.validate(problem, result.plan) == []
    assert hx.evaluate(problem, result.plan).iteration_s == pytest.approx(result.objective_s, rel=1e-9)
    assert result.bound_s is None  # baselines prove nothing about the optimum
    assert result.restrictions  # and say what they left out


def test_one_tp_uses_a_single_size_and_the_best_one():
    problem = load_problem("tiny-4-llama2-7b")
    result = hx.solve(problem, solver="ablation-one-tp", options=OPTIONS)
    sizes = {s.tp for p in result.plan.pipelines for s in p.stages}
    assert len(sizes) == 1
    # second method: run the heuristic once per allowed size and take the best by hand
    per_size = OPTIONS.model_copy(update={"time_limit_s": OPTIONS.time_limit_s / 3})
    times = {}
    for t in problem.model.tp_sizes(max(m.count for m in problem.cluster.machines)):
        plan = solve_with(problem, per_size, HeuristicOptions(fixed_tp=t)).plan
        if plan is not None:
            times[t] = iteration_time(problem, plan)
            assert {s.tp for p in plan.pipelines for s in p.stages} == {t}
    assert result.objective_s == pytest.approx(min(times.values()), rel=1e-9)
    assert sizes == {min(times, key=times.get)}


@pytest.mark.parametrize("name,knobs", [("ablation-equal-batch", {"equal_batch": True}),
                                        ("random", {"partitioner": "random"})])
def test_baseline_is_the_heuristic_with_exactly_its_knob_turned(name, knobs):
    problem = load_problem("small-8-llama2-7b")
    result = hx.solve(problem, solver=name, options=OPTIONS)
    direct = solve_with(problem, OPTIONS, HeuristicOptions(**knobs))
    assert result.plan.pipelines == direct.plan.pipelines


def test_equal_batch_splits_the_batch_evenly():
    problem = load_problem("small-8-llama2-7b")  # the heuristic runs two pipelines here
    result = hx.solve(problem, solver="ablation-equal-batch", options=OPTIONS)
    batches = [p.batch for p in result.plan.pipelines]
    assert max(batches) - min(batches) <= problem.training.micro_batch
    assert sum(batches) == problem.training.global_batch


def test_random_is_reproducible_by_seed():
    problem = load_problem("small-8-llama2-7b")
    a = hx.solve(problem, solver="random", options=OPTIONS)
    b = hx.solve(problem, solver="random", options=OPTIONS)
    assert a.plan.pipelines == b.plan.pipelines
    assert any("random" in r for r in a.restrictions)
