"""Scale (issue: 10^5 GPUs): links are stored sparsely and read the same as the dense matrix;
the evaluator prices every plan the same through either reading; the batch split of a huge
global batch returns at once and equals the heap split on small ones."""

from __future__ import annotations

import heapq
import time

import numpy as np
import pytest

from instances.generate import generate_cluster, generated_problem
from planner import evaluate, validate
from planner.layered import holders
from planner.base import US
from planner.hardware import DENSE_MACHINES, Cluster, Link, Machine, Rack
from planner.layered.pricing import iteration_time
from planner.problem import Problem
from solvers.common import SolverOptions
from solvers import batch_split
from solvers.batch_split import greedy_increments
from solvers.registry import solve

MIX = "A100-80G:0.3,H800:0.2,H20:0.2,RTX4090:0.15,L40S:0.15"


def reference_matrices(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """The dense bw/lat of docs/plan-space.md §1 written out the old way: default, then rack pairs,
    then link overrides (a link without a latency keeps the pair's rack or default latency),
    then the diagonal."""
    n = len(cluster.machines)
    index = {m.name: i for i, m in enumerate(cluster.machines)}
    bw = np.full((n, n), cluster.inter_bw_gbps, dtype=float)
    lat = np.full((n, n), cluster.inter_latency_us * US, dtype=float)
    for rack in cluster.racks:
        ids = [index[name] for name in rack.machines]
        for i in ids:
            for j in ids:
                bw[i, j] = rack.bw_gbps
                lat[i, j] = (cluster.inter_latency_us if rack.latency_us is None else rack.latency_us) * US
    for link in cluster.links:
        i, j = index[link.a], index[link.b]
        bw[i, j] = bw[j, i] = link.bw_gbps
        if link.latency_us is not None:
            lat[i, j] = lat[j, i] = link.latency_us * US
    for i, m in enumerate(cluster.machines):
        bw[i, i] = m.intra_bw_gbps
        lat[i, i] = (m.intra_latency_us if m.intra_latency_us is not None else cluster.intra_latency_us) * US
    return bw, lat


def random_cluster(rng: np.random.Generator, machines: int) -> Cluster:
    """Racks (some without a latency), overrides inside and across racks (some without one)."""
    ms = [Machine(name=f"m{i}", gpu=str(rng.choice(["A100-80G", "H20", "RTX4090"])), count=int(rng.choice([1, 2, 4, 8])),
                  intra_bw_gbps=float(rng.choice([16, 300, 900])),
                  intra_latency_us=None if rng.random() < 0.5 else float(rng.choice([1.0, 3.0])))
          for i in range(machines)]
    order = rng.permutation(machines)
    racks, at = [], 0
    while at < machines - 1 and rng.random() < 0.8:
        size = int(rng.integers(2, 6))
        members = order[at: at + size]
        at += size
        if len(members) > 1:
            racks.append(Rack(machines=tuple(f"m{i}" for i in members), bw_gbps=float(rng.choice([12.5, 25.0])),
                              latency_us=None if rng.random() < 0.3 else 15.0))
    links = {}
    for _ in range(int(rng.integers(0, 2 * machines))):
        i, j = sorted(rng.choice(machines, 2, replace=False).tolist())
        links[(i, j)] = Link(a=f"m{i}", b=f"m{j}", bw_gbps=float(rng.choice([0.5, 1.25, 50.0])),
                             latency_us=None if rng.random() < 0.3 else float(rng.choice([10.0, 60.0])))
    return Cluster(machines=tuple(ms), inter_bw_gbps=float(rng.choice([1.25, 3.125])), inter_latency_us=40.0,
                   racks=tuple(racks), links=tuple(links.values()))


@pytest.mark.parametrize("seed", range(12))
def test_sparse_lookups_equal_the_dense_matrices(seed):
    rng = np.random.default_rng(seed)
    cluster = random_cluster(rng, int(rng.integers(2, 30)))
    bw, lat = reference_matrices(cluster)
    assert np.array_equal(cluster.bw_matrix, bw) and np.array_equal(cluster.lat_matrix, lat)
    n = len(cluster.machines)
    mi, mj = rng.integers(0, n, (2, 500))
    assert np.array_equal(cluster.bw_table(mi, mj), bw[mi, mj])
    assert np.array_equal(cluster.lat_table(mi, mj), lat[mi, mj])
    assert np.array_equal(cluster.pair_bw(mi, mj), bw[mi, mj])
    d0, d1 = rng.integers(0, cluster.num_devices, 2)
    assert cluster.bw(d0, d1) == bw[cluster.machine_of_device[d0], cluster.machine_of_device[d1]]


@pytest.mark.parametrize("seed", range(12))
def test_holder_extremes_without_pairs_equal_the_pairwise_reading(seed):
    """PairTable.row_extremes (no D² pairs) and the sparse pairwise reading == the dense one."""
    rng = np.random.default_rng(100 + seed)
    cluster = random_cluster(rng, int(rng.integers(2, 25)))
    bw, lat = cluster.bw_matrix, cluster.lat_matrix
    n = len(cluster.machines)
    for _ in range(20):
        d = int(rng.integers(2, 30))
        rows = rng.integers(0, int(rng.integers(1, n + 1)), (3, d))  # often few machines: repeats
        want_bw, want_lat = holders.holders_bw_lat_rows(rows, bw, lat)
        got_bw = [cluster.bw_table.row_extremes(r, use_max=False) for r in rows]
        got_lat = [cluster.lat_table.row_extremes(r, use_max=True) for r in rows]
        assert list(want_bw) == got_bw and list(want_lat) == got_lat


@pytest.mark.parametrize("seed", range(16))
def test_large_sets_read_from_the_structure_equal_their_pairs(seed, monkeypatch):
    """`within_sets` reads a set of more than MANY_UNITS units from the pair tables' structure
    (a replica striped over 10^5 GPUs); every set, large or small, bridged or not, gets the
    value its size² pairs of units give."""
    from planner.sequence import links
    from test_vendor_planner import with_vendors

    rng = np.random.default_rng(300 + seed)
    cluster = random_cluster(rng, int(rng.integers(2, 40)))
    if seed % 2:
        cluster = with_vendors(cluster, rng)
    n = cluster.num_devices
    num_sets = int(rng.integers(1, min(n, 24) + 1))
    set_of = np.concatenate([np.arange(num_sets), rng.integers(0, num_sets, n - num_sets)])
    set_of = set_of[rng.permutation(n)]  # every set non-empty, members on random machines
    units = links.Units.of(len(cluster.machines), set_of, cluster.machine_of_device, num_sets)
    want_bw, want_lat = links.within_sets_by_pairs(cluster, units)
    # the largest sets take the new route, the others (if any) the pairs or blocks
    monkeypatch.setattr(links, "MANY_UNITS", max(0, int(units.size.max()) - 1 - int(rng.integers(0, 3))))
    got_bw, got_lat = links.within_sets(cluster, units)
    assert np.array_equal(got_bw, want_bw) and np.array_equal(got_lat, want_lat)
    assert (units.size > links.MANY_UNITS).any()


@pytest.mark.parametrize("seed", range(16))
def test_extremes_toward_a_set_equal_the_dense_rows(seed):
    """`PairTable.toward` (no sources × targets pairs) == the dense matrix's row extremes over
    the targets, bridged or not."""
    from test_vendor_planner import with_vendors

    rng = np.random.default_rng(500 + seed)
    cluster = random_cluster(rng, int(rng.integers(2, 40)))
    if seed % 2:
        cluster = with_vendors(cluster, rng)
    n = len(cluster.machines)
    for _ in range(10):
        order = rng.permutation(n)
        cut = int(rng.integers(1, n))
        sources, targets = np.sort(order[:cut]), np.sort(order[cut:int(rng.integers(cut + 1, n + 1))])
        assert np.array_equal(cluster.bw_table.toward(sources, targets, use_max=False),
                              cluster.bw_matrix[np.ix_(sources, targets)].min(axis=1))
        assert np.array_equal(cluster.lat_table.toward(sources, targets, use_max=True),
                              cluster.lat_matrix[np.ix_(sources, targets)].max(axis=1))


def test_generated_clusters_keep_their_links_as_racks():
    """Racks instead of every rack pair as a link: the same figures, a small file."""
    for gpus, seed in [(64, 0), (512, 3), (2048, 1)]:
        cluster = generate_cluster(gpus, MIX, seed)
        as_links = Cluster(machines=cluster.machines, inter_bw_gbps=cluster.inter_bw_gbps,
                           inter_latency_us=cluster.inter_latency_us, links=expanded_links(cluster))
        assert np.array_equal(cluster.bw_matrix, as_links.bw_matrix)
        assert np.array_equal(cluster.lat_matrix, as_links.lat_matrix)
        assert len(cluster.links) <= len(cluster.machines) // 8 + 1


def expanded_links(cluster: Cluster) -> tuple[Link, ...]:
    """The rack pairs as links, overridden by the cluster's own links (the old file layout)."""
    links = {}
    for rack in cluster.racks:
        for i, a in enumerate(rack.machines):
            for b in rack.machines[i + 1:]:
                links[frozenset((a, b))] = Link(a=a, b=b, bw_gbps=rack.bw_gbps, latency_us=rack.latency_us)
    for link in cluster.links:
        links[frozenset((link.a, link.b))] = link
    return tuple(links.values())


def big_sparse_twin(problem: Problem) -> Problem:
    """The same problem with idle filler machines appended, so that the cluster is past the
    dense-lookup size and prices through the sparse tables (the filler is never in a plan;
    T does not read it, MFU does)."""
    cluster = problem.cluster
    filler = tuple(Machine(name=f"filler-{i}", gpu="T4", count=1, intra_bw_gbps=10.0) for i in range(1100))
    big = cluster.model_copy(update={"machines": cluster.machines + filler})
    big = Cluster.model_validate(big.model_dump())
    assert not big.dense_lookup
    return problem.model_copy(update={"cluster": big})


@pytest.mark.parametrize("gpus,seed", [(128, 0), (512, 1)])
def test_the_evaluator_prices_random_plans_the_same_sparse_and_dense(gpus, seed):
    problem = generated_problem(generate_cluster(gpus, MIX, seed), "llama2-7b", seq_len=1024,
                                global_batch=gpus * 4)
    twin = big_sparse_twin(problem)
    rng = np.random.default_rng(seed)
    for plan in random_plans(problem, rng, 12):
        assert iteration_time(problem, plan, check=False) == iteration_time(twin, plan, check=False)
        a, b = evaluate(problem, plan), evaluate(twin, plan)
        assert a.iteration_s == b.iteration_s
        assert [s.pp_s for p in a.pipelines for s in p.stages] == [s.pp_s for p in b.pipelines for s in p.stages]
        assert [s.dp_s for p in a.pipelines for s in p.stages] == [s.dp_s for p in b.pipelines for s in p.stages]


def random_plans(problem: Problem, rng: np.random.Generator, count: int):
    """Structurally valid plans with many pipelines (the DP holders span machines and racks)."""
    from planner.layered.plan import Plan

    cluster, model = problem.cluster, problem.model
    for _ in range(count):
        pipelines = int(rng.integers(2, 40))
        slots = []  # (devices) TP groups: cut machines into power-of-two groups
        for m in rng.permutation(len(cluster.machines)):
            devices = cluster.devices_of(int(m))
            t = int(rng.choice([1, 2, 4]))
            slots += [tuple(devices[k: k + t]) for k in range(0, len(devices) - t + 1, t)]
        stages_per = int(rng.integers(1, 4))
        if pipelines * stages_per > len(slots):
            pipelines = len(slots) // stages_per
        stages, at = [], 0
        for _ in range(pipelines):
            cuts = np.sort(rng.choice(np.arange(1, model.layers), stages_per - 1, replace=False))
            layers = np.diff(np.concatenate([[0], cuts, [model.layers]]))
            stages.append([(slots[at + k], int(n)) for k, n in enumerate(layers)])
            at += stages_per
        micro = 1 + greedy_increments(rng.random(pipelines), rng.random(pipelines),
                                      problem.training.micro_batches - pipelines)
        yield Plan.from_stages(problem=problem.name, batches=[int(x) * problem.training.micro_batch for x in micro],
                               stages=stages)


def heap_split(base, step, extra):
    """The original batch split: one heap step per micro-batch."""
    micro = np.zeros(len(base), dtype=int)
    heap = [(base[p] + step[p], p) for p in range(len(base))]
    heapq.heapify(heap)
    for _ in range(extra):
        _, p = heapq.heappop(heap)
        micro[p] += 1
        heapq.heappush(heap, (base[p] + (micro[p] + 1) * step[p], p))
    return micro


@pytest.mark.parametrize("seed", range(40))
def test_batch_split_equals_the_heap(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 15))
    kind = seed % 4
    if kind == 0:
        base, step = rng.random(d) * 10, rng.random(d)
    elif kind == 1:  # ties and pipelines that cost nothing more per micro-batch
        base, step = rng.integers(0, 4, d).astype(float), rng.integers(0, 3, d).astype(float)
    elif kind == 2:
        base, step = np.full(d, 1.5), np.full(d, 0.25)
    else:
        base, step = rng.random(d) * 1e-3, rng.choice([0.1, 0.3, 0.7], d)
    for extra in (0, 1, int(rng.integers(2, 400))):
        assert np.array_equal(greedy_increments(base, step, extra), heap_split(base, step, extra))


@pytest.mark.parametrize("seed", range(30))
def test_both_ways_to_the_split_equal_the_heap(seed):
    """The water level corrected by a heap (up to 512 pipelines) and the bisection (above, and
    where a pipeline costs nothing more per micro-batch): pipelines far above the level, tiny
    steps, equal values across pipelines."""
    rng = np.random.default_rng(seed)
    d, kind = int(rng.integers(1, 40)), seed % 3
    if kind == 0:
        base, step = rng.random(d) * 1e3, rng.random(d) * 1e-3 + 1e-12
    elif kind == 1:
        base, step = rng.choice([0.1, 0.2, 0.3], d), rng.choice([0.1, 0.3, 0.7], d)
    else:
        base, step = rng.random(d) * 10, rng.random(d) + 1e-9
    for extra in (1, d, int(rng.integers(2, 3000))):
        expected = heap_split(base, step, extra)
        level = batch_split._water_level(base, step, extra)
        # from the water level, and from levels that take too many or too few to start with
        for start in (level, level * 1.01 + 0.05, level * 0.98 - 0.02):
            assert np.array_equal(batch_split._corrected_at_level(base, step, extra, start), expected), start
        assert np.array_equal(batch_split._bisected(base, step, extra), expected)


def test_batch_split_of_a_huge_batch_is_quick():
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    micro = greedy_increments(rng.random(2000) * 10, rng.random(2000), 10**12)
    assert time.perf_counter() - start < 1.0
    assert micro.sum() == 10**12


def test_solve_with_a_global_batch_of_1e12_returns():
    problem = generated_problem(generate_cluster(64, MIX, 0), "llama2-7b", seq_len=1024, global_batch=10**12)
    start = time.perf_counter()
    result = solve(problem, "heuristic", SolverOptions(time_limit_s=5, seed=0))
    assert time.perf_counter() - start < 60
    assert result.plan is not None and sum(p.batch for p in result.plan.pipelines) == 10**12
    assert validate(problem, result.plan) == []


def test_dense_matrices_refused_on_huge_clusters():
    machines = tuple(Machine(name=f"m{i}", gpu="H20", count=1, intra_bw_gbps=900.0) for i in range(DENSE_MACHINES + 1))
    cluster = Cluster(machines=machines, inter_bw_gbps=3.125, links=(Link(a="m0", b="m1", bw_gbps=1.0),))
    with pytest.raises(ValueError, match="pair_bw"):
        _ = cluster.bw_matrix
    assert cluster.pair_bw(np.array([0, 0, 2]), np.array([1, 0, 3])).tolist() == [1.0, 900.0, 3.125]


def test_racks_are_checked():
    ms = tuple(Machine(name=f"m{i}", gpu="H20", count=1, intra_bw_gbps=900.0) for i in range(3))
    with pytest.raises(ValueError, match="unknown machine 'x'"):
        Cluster(machines=ms, inter_bw_gbps=1.0, racks=(Rack(machines=("m0", "x"), bw_gbps=2.0),))
    with pytest.raises(ValueError, match="in racks\\[0\\] and racks\\[1\\]"):
        Cluster(machines=ms, inter_bw_gbps=1.0, racks=(Rack(machines=("m0", "m1"), bw_gbps=2.0),
                                                       Rack(machines=("m1", "m2"), bw_gbps=2.0)))


def test_equal_problems_compare_equal_after_their_arrays_are_computed():
    """pydantic's == compared __dict__ first, cached device arrays included: numpy's truth value
    of an array raised there (a job checks its cluster against its problem's with !=)."""
    from planner.io import load_problem

    a, b, other = load_problem("demo-tiny"), load_problem("demo-tiny"), load_problem("demo-asym")
    for problem in (a, b, other):
        problem.cluster.machine_of_device, problem.cluster.machine_memory_bytes  # noqa: B018 (cached arrays)
    assert a == b and a.cluster == b.cluster and hash(a.cluster) == hash(b.cluster)
    assert a != other and a.cluster != other.cluster
