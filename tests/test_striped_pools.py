"""The striped pools of the heuristic's phase 1 (solvers/layered/heuristic/partition.py):
"data" deals every machine across the pools; "machines" deals whole each group of like
machines whose number D divides, so every pool still gets the same mix and a stage may take a
whole machine as its TP group."""

from __future__ import annotations

from collections import Counter

import pytest

from instances.generate import generate_cluster, generated_problem
from planner.layered.pricing import iteration_time
from solvers.common import SolverOptions
from solvers.layered.heuristic import HeuristicOptions, solve_with
from solvers.layered.heuristic.partition import striped_pools

MIX = "A100-80G:1,RTX4090:1,H20:1"


def _mix(problem, pool) -> Counter:
    cluster = problem.cluster
    return Counter(cluster.gpu_of(int(cluster.machine_of_device[d])).name for d in pool)


@pytest.mark.parametrize("gpus, seed, pools", [(24, 0, 2), (24, 1, 2), (40, 2, 2), (40, 3, 4), (64, 0, 2)])
def test_whole_groups_stay_whole_and_every_device_is_dealt_once(gpus: int, seed: int, pools: int) -> None:
    problem = generated_problem(generate_cluster(gpus, MIX, seed), "llama2-13b")
    cluster = problem.cluster
    dealt = striped_pools(problem, pools, whole=True)
    assert sorted(d for pool in dealt for d in pool) == list(range(cluster.num_devices))
    groups = Counter((m.gpu, m.count) for m in cluster.machines)
    pool_of = {int(d): p for p, pool in enumerate(dealt) for d in pool}
    for m, machine in enumerate(cluster.machines):
        holders = {pool_of[d] for d in cluster.devices_of(m)}
        if groups[(machine.gpu, machine.count)] % pools == 0:
            assert len(holders) == 1, f"machine {m} ({machine.gpu}) was cut"
        else:
            assert len(holders) == min(machine.count, pools), f"machine {m} was not striped"
    if all(k % pools == 0 or all(m.count % pools == 0 for m in cluster.machines if (m.gpu, m.count) == g)
           for g, k in groups.items()):
        assert len({tuple(sorted(_mix(problem, pool).items())) for pool in dealt}) == 1  # one mix in every pool


def test_the_heuristic_finds_the_whole_machine_split() -> None:
    """gen-24 seed 0 (one A100 and one 4090 machine of 8, two H20 machines of 4): D = 2 with one
    H20 machine per pipeline (the plan the bound's tables read back) is 4.3 % faster than what
    the striped and METIS splits gave (6.406 s)."""
    problem = generated_problem(generate_cluster(24, MIX, 0), "llama2-13b")
    # the structure moves at their least work (400 structures: 6.128 s; 4,800, a 30 s limit's: 6.122 s)
    plan = solve_with(problem, SolverOptions(time_limit_s=30, threads=1),
                      HeuristicOptions(pipelines=(2,), protect="machines", move_evaluations=400)).plan
    assert iteration_time(problem, plan) < 6.406 * (1 - 0.04)
    data = solve_with(problem, SolverOptions(time_limit_s=30, threads=1),
                      HeuristicOptions(pipelines=(2,), protect="data", move_evaluations=400)).plan
    assert iteration_time(problem, plan) < iteration_time(problem, data)
