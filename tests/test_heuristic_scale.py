"""The heuristic on large generated clusters (issue 16): the time limit is a promise, a plan
comes back early, and the pools keep slow links out of the DP sync.

The 32k and 100k sizes are in `benchmarks/bench_scaling.py --sizes large` (minutes); here a
16,384-GPU cluster keeps the file under a minute.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from instances.generate import generate_cluster, generated_problem
from planner.layered.validate import validate
from solvers.common import SolverOptions
from solvers.layered.heuristic import solve
from solvers.layered.heuristic.partition import _machine_pairs, metis_pools
from solvers.layered.heuristic.pipeline import PipelineLimits, build_pipeline
from solvers.layered.heuristic.search import anytime_order, coarse_candidates, estimated_d

MIX = "A100-80G:0.3,H800:0.2,H20:0.2,RTX4090:0.15,L40S:0.15"


@pytest.fixture(scope="module")
def big():
    return generated_problem(generate_cluster(16384, MIX, seed=0), "llama2-70b", seq_len=4096)


def test_a_5_s_limit_returns_a_plan_at_16k_gpus(big):
    """The search stops at its deadline with the best plan so far. The promise itself (within
    10 % at 5–60 s, 4k–100k GPUs) is measured by benchmarks/bench_scaling.py --time-limit: a
    shared CI machine cannot time it; this bound (3× the limit) only catches a search that
    ignores its deadline (before the anytime search: over a minute here)."""
    start = time.perf_counter()
    result = solve(big, SolverOptions(time_limit_s=5, seed=0))
    wall = time.perf_counter() - start
    assert wall <= 15, wall
    assert result.plan is not None and not validate(big, result.plan)
    assert len(result.plan.devices) > big.cluster.num_devices / 2  # not a D = 1 plan on a corner


def test_candidates_start_near_the_closed_form_guess(big):
    grid = coarse_candidates(6000, 14)
    order = anytime_order(big, grid)
    guess = estimated_d(big)
    assert abs(np.log(order[0] / guess)) == min(abs(np.log(d / guess)) for d in order)
    usable = big.model.layers * int(big.cluster.machine_counts.max())
    assert all(big.cluster.num_devices <= 2 * usable * d for d in order)  # no D = 1 pools of 16k GPUs


def test_machine_pools_keep_every_slow_link_inside_one_pool(big):
    cluster = big.cluster
    pools = metis_pools(big, 74, seed=0)
    assert sorted(np.concatenate(pools).tolist()) == list(range(cluster.num_devices))
    pool_of = np.empty(len(cluster.machines), dtype=int)
    for k, pool in enumerate(pools):
        machines = np.unique(cluster.machine_of_device[pool])
        pool_of[machines] = k
        assert len(pool) == cluster.machine_counts[machines].sum()  # whole machines
    a, b = _machine_pairs(cluster)
    slow = cluster.pair_bw(a, b) < cluster.inter_bw_gbps
    assert slow.any() and np.all(pool_of[a[slow]] == pool_of[b[slow]])


def test_one_pool_of_the_whole_cluster_is_built_quickly(big):
    start = time.perf_counter()
    built = build_pipeline(big, np.arange(big.cluster.num_devices), limits=PipelineLimits(micro=64))
    assert built is not None and len(built[0]) <= big.model.layers
    assert time.perf_counter() - start < 5
