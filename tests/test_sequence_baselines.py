"""The uniform sequence baselines (solvers/sequence/baselines.py): `seq-uniform` is the best
uniform layout over the device sets a user would try, so it is never slower than the old
all-devices layout (`seq-uniform-all`) nor than any uniform layout on one GPU type alone
(enumerated here independently of the solver), it drops a slow type when that pays and
keeps it when it does not; every plan is uniform, valid and priced as the evaluator prices
it; the search is deterministic and stops at its time limit."""

from __future__ import annotations

import time

import pytest

from planner import evaluate, validate
from planner.io import load_problem
from planner.problem import Problem
from planner.sequence import SeqPlan
from planner.solver_info import SolveStatus
from solvers import registry
from solvers.common import SolverOptions
from solvers.sequence import baselines

BUNDLED = ["longctx-tiny", "longctx-sim-32-llama3-8b-128k", "longctx-h100-a100-llama3-8b-128k"]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def one_type_best(problem: Problem, gpu: str) -> float:
    """The fastest uniform plan on the devices of one GPU type (file order, groups of n
    consecutive devices), by brute enumeration priced with planner.evaluate; inf if none fits."""
    cluster, model, tr = problem.cluster, problem.model, problem.training
    devices = [d for m, machine in enumerate(cluster.machines) if machine.gpu == gpu for d in cluster.devices_of(m)]
    s, q, best = tr.seq_len, tr.token_block, float("inf")
    for n in divisors(model.num_kv_heads):
        for replicas in divisors(tr.global_batch // tr.micro_batch):
            for groups in range(1, len(devices) // (n * replicas) + 1):
                if s % (2 * q * groups) or (s // groups) % (n * q):
                    continue
                it = iter(devices)
                rings = [[[(next(it), model.heads // n, s // (groups * n)) for _ in range(n)] for _ in range(groups)]
                         for _ in range(replicas)]
                plan = SeqPlan.from_rings(problem=problem.name, batches=[tr.global_batch // replicas] * replicas,
                                          rings=rings)
                if not validate(problem, plan):
                    best = min(best, evaluate(problem, plan).iteration_s)
    return best


def used_types(problem: Problem, plan: SeqPlan) -> set[str]:
    cluster = problem.cluster
    return {cluster.gpu_of(int(cluster.machine_of_device[m.device])).name
            for r in plan.replicas for g in r.ring for m in g.members}


def assert_uniform(problem: Problem, res) -> None:
    """Feasible, valid, T = evaluate's, and every replica, group and member alike."""
    assert res.status == SolveStatus.feasible and validate(problem, res.plan) == []
    assert res.objective_s == evaluate(problem, res.plan).iteration_s
    assert res.plan.solver.objective_s == res.objective_s and res.plan.solver.name == res.solver
    replicas = res.plan.replicas
    assert len({(r.batch, len(r.ring), tuple(len(g.members) for g in r.ring)) for r in replicas}) == 1
    assert len({(m.heads, m.tokens) for r in replicas for g in r.ring for m in g.members}) == 1


@pytest.fixture(scope="module", params=BUNDLED)
def solved(request):
    problem = load_problem(request.param)
    return problem, baselines.solve_uniform(problem), baselines.solve_uniform_all(problem)


def test_both_uniform_baselines_return_uniform_plans_priced_by_the_evaluator(solved):
    problem, new, old = solved
    assert_uniform(problem, new)
    assert_uniform(problem, old)


def test_seq_uniform_is_never_slower_than_the_all_devices_layout_or_one_type_alone(solved):
    problem, new, old = solved
    assert new.objective_s <= old.objective_s
    for gpu in dict.fromkeys(m.gpu for m in problem.cluster.machines):
        assert new.objective_s <= one_type_best(problem, gpu) * (1 + 1e-12), gpu


def test_seq_uniform_drops_the_slow_type_when_that_pays():
    problem = load_problem("longctx-h100-a100-llama3-8b-128k")  # A100: 312 vs 989 TFLOP/s
    new, old = baselines.solve_uniform(problem), baselines.solve_uniform_all(problem)
    assert used_types(problem, new.plan) == {"H100"}
    assert used_types(problem, old.plan) == {"H100", "A100-80G"}
    assert new.objective_s < 0.7 * old.objective_s  # 26.4 s against 41.7 s when written


def test_seq_uniform_keeps_a_type_about_as_fast():
    problem = load_problem("longctx-h100-mi300x-llama3-8b-128k")  # n = 1 groups: no vendor mixing
    new = baselines.solve_uniform(problem)
    assert used_types(problem, new.plan) == {"H100", "MI300X"}
    assert sum(len(g.members) for r in new.plan.replicas for g in r.ring) == problem.cluster.num_devices


def test_type_sets_are_prefixes_of_the_speed_ranking_then_each_type_alone():
    problem = load_problem("longctx-sim-128-llama3-8b-128k")
    # peak TFLOP/s 989, 362, 312, 125 at one η: L40S before A100 although it has less memory
    assert baselines.type_ranking(problem) == ["H100", "L40S", "A100-80G", "V100"]
    assert baselines.type_sets(problem) == [("H100",), ("H100", "L40S"), ("H100", "L40S", "A100-80G"),
                                            ("H100", "L40S", "A100-80G", "V100"), ("L40S",), ("A100-80G",),
                                            ("V100",)]


def test_machine_blocks_keep_groups_inside_one_machine():
    problem = load_problem("longctx-sim-32-llama3-8b-128k")
    machine = problem.cluster.machine_of_device
    for degree in (2, 4, 8):
        blocks = baselines.machine_blocks(problem, list(range(problem.cluster.num_devices)), degree)
        assert blocks and all(len({int(machine[d]) for d in b}) == 1 and len(b) == degree for b in blocks)


def test_seq_uniform_is_deterministic_and_stops_at_its_time_limit():
    problem = load_problem("longctx-sim-128-llama3-8b-128k")
    a, b = baselines.solve_uniform(problem), baselines.solve_uniform(problem)
    assert a.plan.replicas == b.plan.replicas and a.objective_s == b.objective_s
    start = time.perf_counter()
    quick = baselines.solve_uniform(problem, SolverOptions(time_limit_s=1e-6))
    assert time.perf_counter() - start < 1.0 and "best of 1 layouts" in quick.message
    assert_uniform(problem, quick)


def test_registry_names_both_uniform_baselines():
    problem = load_problem("longctx-tiny")
    for name in ("seq-uniform", "seq-uniform-all"):
        res = registry.solve(problem, name, kind="sequence")
        assert res.solver == name
        assert_uniform(problem, res)
