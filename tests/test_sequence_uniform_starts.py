"""The sequence heuristic against `seq-uniform` (docs/sequence-plans.md §7): it polishes the
best uniform layout (solvers/sequence/uniform_starts.py), so it is never slower on the same
problem, and its coarse stage tries the fastest GPU types alone and grows device sets by
idle machines, so it beats the uniform layout where a few slower machines help."""

from __future__ import annotations

import time

import pytest

from planner.io import load_problem
from solvers.common import SolverOptions
from solvers.sequence import baselines, heuristic, uniform_starts
from solvers.sequence.coarse import growth_machines
from solvers.sequence.heuristic import device_sets, type_sets
from solvers.sequence.space import plan_time

BUNDLED = ["longctx-tiny", "longctx-sim-32-llama3-8b-128k", "longctx-sim-64-llama3-8b-128k",
           "longctx-sim-128-llama3-8b-128k", "longctx-sim-128-llama-30b-512k",
           "longctx-h100-a100-llama3-8b-64k", "longctx-h100-a100-llama-30b-256k", "longctx-h100-mi300x-llama3-8b-128k"]


def _gpu(problem, device: int) -> str:
    return problem.cluster.machines[int(problem.cluster.machine_of_device[device])].gpu


def _layout_key(rings) -> tuple:
    return tuple(tuple(tuple(m) for g in ring for m in g) for ring in rings)


@pytest.mark.parametrize("name", BUNDLED)
def test_heuristic_is_never_slower_than_seq_uniform(name):
    problem = load_problem(name)
    heur, uniform = heuristic.solve(problem), baselines.solve_uniform(problem)
    assert heur.plan is not None and uniform.plan is not None
    assert heur.objective_s <= uniform.objective_s * (1 + 1e-12), (heur.message, uniform.message)


@pytest.mark.parametrize("name, least", [("longctx-h100-a100-llama3-8b-64k", 1.2),
                                         ("longctx-sim-128-llama-30b-512k", 1.02)])
def test_heuristic_beats_seq_uniform_where_uneven_plans_help(name, least):
    """64k: uniform rings of H100s and of A100s with more micro-batches on the H100 ones;
    512k: the H100 layout grown by an A100 machine of the same rack (uneven shards)."""
    problem = load_problem(name)
    heur, uniform = heuristic.solve(problem), baselines.solve_uniform(problem)
    assert uniform.objective_s / heur.objective_s >= least, heur.message


@pytest.mark.parametrize("name", ["longctx-tiny", "longctx-sim-32-llama3-8b-128k", "longctx-h100-a100-llama3-8b-64k",
                                  "longctx-sim-128-llama-30b-512k"])
def test_best_uniform_is_priced_as_the_planner_and_no_slower_than_the_baseline(name):
    problem = load_problem(name)
    best = uniform_starts.best_uniform(problem, time.perf_counter() + 60, keep=3)
    assert best and [c[0] for c in best] == sorted(c[0] for c in best)
    for (over, t), batches, rings, label in best:
        assert over == 0 and label[3] == uniform_starts.UNIFORM and len(rings) == label[2]
        assert plan_time(problem, batches, rings) == (pytest.approx(t, rel=1e-12), True)
        assert sum(batches) == problem.training.global_batch
    assert best[0][0][1] <= baselines.solve_uniform(problem).objective_s * (1 + 1e-12)


@pytest.mark.parametrize("name", ["longctx-sim-32-llama3-8b-128k", "longctx-h100-a100-llama3-8b-64k"])
def test_uniform_starts_cover_every_layout_of_the_baseline_that_fits(name):
    problem = load_problem(name)
    runs = uniform_starts.priced_runs(problem, time.perf_counter() + 60)
    mine = {_layout_key(run.rings[:d]) for _, _, run, d, _ in uniform_starts.layouts(problem, runs)}
    fitting = 0
    for (_, replicas, _), rings in baselines.subset_layouts(problem):
        if plan_time(problem, [problem.training.global_batch // replicas] * replicas, rings)[1]:
            fitting += 1
            assert _layout_key(rings) in mine
    assert fitting >= 10


def test_type_sets_drop_the_slowest_gpu_types_first():
    problem = load_problem("longctx-sim-128-llama3-8b-128k")
    sets = type_sets(problem)
    assert len(sets[0]) == problem.cluster.num_devices
    assert [len(s) for s in sets] == sorted((len(s) for s in sets), reverse=True) and len(sets) == 4
    assert {_gpu(problem, d) for d in sets[-1]} == {"H100"}  # the fastest type alone
    assert {_gpu(problem, d) for d in sets[-2]} == {"H100", "L40S"}  # ranked by time per token, as seq-uniform
    every, swept = device_sets(problem)
    assert every[:swept] == sets


def test_growth_machines_pick_one_idle_machine_per_type_next_to_the_used_ones():
    problem = load_problem("longctx-sim-128-llama3-8b-128k")
    cluster = problem.cluster
    h100 = type_sets(problem)[-1]
    picks = [cluster.machines[block[0]] for block in growth_machines(problem, h100)]
    assert sorted(m.gpu for m in picks) == ["A100-80G", "L40S", "V100"]
    # a100-80g-0 shares the H100s' rack; a100-80g-2 has a slow link to h100-0
    assert [m.name for m in picks if m.gpu == "A100-80G"] == ["a100-80g-0"]
    assert growth_machines(problem, list(range(cluster.num_devices))) == []
    # D at a time (one per replica): each type's best first, then the next best linked
    blocks = growth_machines(problem, h100, per_type=3)
    assert [cluster.machines[m].gpu for m in blocks[0]] == [picks[0].gpu] * len(blocks[0])
    assert [block[0] for block in blocks] == [block[0] for block in growth_machines(problem, h100)]
    assert all(1 <= len(block) <= 3 for block in blocks) and max(len(block) for block in blocks) > 1


def test_heuristic_deterministic_and_timely_with_uniform_starts():
    problem = load_problem("longctx-sim-128-llama-30b-512k")
    a, b = (heuristic.solve(problem, SolverOptions(seed=5)) for _ in range(2))
    assert a.plan.replicas == b.plan.replicas and a.objective_s == b.objective_s
    start = time.perf_counter()
    quick = heuristic.solve(problem, SolverOptions(time_limit_s=0.02))
    assert quick.plan is not None and time.perf_counter() - start < 2.0


def test_a_plan_grows_by_one_machine_per_replica_where_one_alone_cannot_help():
    """1,024 GPUs (H100 and A100), s = 2^20, B = 4: attention compute bounds every replica and
    three quarters of the cluster was idle. A machine joining one replica leaves the other
    three as slow, so growing one machine at a time stopped at the uniform start (256 devices,
    376 s) where a replan of the same cluster found 295 s on 518; growing D machines at once
    (one for each replica) goes past it."""
    from instances.generate import generate_cluster, generated_problem
    from planner.kinds import iteration_time

    problem = generated_problem(generate_cluster(1024, "H100:0.5,A100-80G:0.5", 5), "llama2-70b", seq_len=2**20,
                                global_batch=4)
    start = uniform_starts.best_uniform(problem, time.perf_counter() + 30, time.perf_counter() + 30)
    result = heuristic.solve(problem, SolverOptions(time_limit_s=60))
    assert len(result.plan.devices) > len({m[0] for ring in start[0][2] for g in ring for m in g})
    assert iteration_time(problem, result.plan) < 0.85 * start[0][0][1]
