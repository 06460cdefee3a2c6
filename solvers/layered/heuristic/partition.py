"""Phase 1: split the cluster into D data-parallel pools (docs/solvers.md §5).

The cluster is a graph whose vertices are devices weighted by effective compute π and whose
edges are links weighted by bandwidth. METIS (pymetis) does the multilevel k-way partition
(heavy-edge coarsening, initial partition, projection, FM refinement); what METIS cannot
express is written here: which links to protect, and the sparse edge set.

Which links to protect: inside a pool run the pipeline's activations (and the TP groups,
which never leave a machine); between pools run the gradient all-reduces. In "pipeline" mode
the edge weight grows with bandwidth and METIS puts the cut on the slowest links. In "data"
mode the DP sync is what must stay fast: it pairs stage k of every pipeline, so the best
pools are *striped* — every machine dealt out across several pools, so that the holders of a
layer share a machine. A min-cut partitioner cannot express "spread each machine out", so
that split is written by hand (`striped_pools`).

Inter-machine pairs at the cluster's default bandwidth carry no information but balance, so
they are left out: the graph stays sparse at thousands of devices. Above
`MACHINE_GRAPH_DEVICES` METIS splits the machine graph instead (whole machines per pool, a
tenth of the vertices and no device-pair edges), with every link slower than the default
contracted first: such a link between two pools would set bw_min of the DP sync (§3.4) for
every layer its machines hold, while inside a pool the stage order steps around it.

Mixed vendors (docs/vendors.md §8): every bandwidth read here is the bridged one (`Cluster.pair_bw`),
so a rack or link pair between an nvidia and an amd machine weighs what the bridge allows,
and the other cross-vendor pairs, at or below the default, carry no edge at all (weight 0,
the lightest): the partitioner never protects a bridge link. Which side of the bridge a
pool's pipelines or DP groups should sit on is left to the pricing of every candidate (§3).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pymetis

from planner.cost import reserve_bytes
from planner.problem import Problem

Protect = str  # "pipeline", "data", "machines" or one of TIERED_MODES, UNEVEN_MODES
INTRA_WEIGHT_FACTOR = 4  # intra-machine edges outweigh any inter-machine edge
MACHINE_GRAPH_DEVICES = 4096  # above this many devices METIS splits the machine graph
SLOW_LINK_WEIGHT = 200  # machine graph: a link slower than the default, kept inside a pool


def _edge_weights(bw: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Integer METIS weights 1..100 from inter-machine bandwidths (log scale)."""
    span = max(np.log(hi) - np.log(lo), 1e-9)
    return np.rint(1 + 99 * (np.log(bw) - np.log(lo)) / span).astype(np.int64)


def _machine_pairs(cluster) -> tuple[np.ndarray, np.ndarray]:
    """Machine pairs (i < j, in row order) whose link differs from the default inter-machine
    bandwidth: only rack pairs and overridden pairs can, so only those are looked at."""
    n = len(cluster.machines)
    candidates = [cluster.bw_table.keys]
    for r in range(len(cluster.racks)):
        members = np.flatnonzero(cluster.machine_rack == r)
        a, b = np.triu_indices(len(members), k=1)
        candidates.append(members[a] * n + members[b])
    i, j = np.divmod(np.unique(np.concatenate(candidates)), n)
    keep = cluster.pair_bw(i, j) != cluster.inter_bw_gbps
    return i[keep], j[keep]


_GRAPHS: dict[int, tuple] = {}  # id(cluster) -> (cluster, graph): the last cluster's graph


def device_graph(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR adjacency (xadj, adjncy, eweights) of the device graph, built once per cluster
    (the search partitions one cluster for every D it tries)."""
    cluster = problem.cluster
    kept = _GRAPHS.get(id(cluster))
    if kept is not None and kept[0] is cluster:
        return kept[1]
    graph = _device_graph(cluster)
    _GRAPHS.clear()
    _GRAPHS[id(cluster)] = (cluster, graph)
    return graph


def _device_graph(cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    first, counts = cluster.first_device, cluster.machine_counts
    mi, mj = _machine_pairs(cluster)
    pair_bw = cluster.pair_bw(mi, mj)
    inter = np.append(pair_bw, cluster.inter_bw_gbps)
    lo, hi = float(inter.min()), float(inter.max())
    src, dst, wgt = [], [], []
    for c in np.unique(counts).tolist():  # intra-machine cliques, machines of one size at once
        starts = first[counts == c][:, None]
        a, b = np.triu_indices(c, k=1)
        src.append((starts + a).ravel())
        dst.append((starts + b).ravel())
        wgt.append(np.full(src[-1].size, 100 * INTRA_WEIGHT_FACTOR, dtype=np.int64))
    weights = _edge_weights(pair_bw, lo, hi) if len(mi) else np.zeros(0, np.int64)
    sizes = counts[mi] * (counts.max() + 1) + counts[mj]
    for size in np.unique(sizes).tolist():  # every device pair of two linked machines, by sizes
        ca, cb = divmod(size, int(counts.max()) + 1)
        pick = sizes == size
        da, db = np.repeat(np.arange(ca), cb), np.tile(np.arange(cb), ca)
        src.append((first[mi[pick]][:, None] + da).ravel())
        dst.append((first[mj[pick]][:, None] + db).ravel())
        wgt.append(np.repeat(weights[pick], ca * cb))
    return _to_csr(cluster.num_devices, np.concatenate(src), np.concatenate(dst), np.concatenate(wgt))


def _to_csr(n: int, src: np.ndarray, dst: np.ndarray, wgt: np.ndarray):
    both_src = np.concatenate([src, dst]).astype(np.int64)
    both_dst = np.concatenate([dst, src]).astype(np.int64)
    both_w = np.concatenate([wgt, wgt])
    order = np.argsort(both_src * n + both_dst)  # by (src, dst); keys are distinct
    xadj = np.concatenate([[0], np.cumsum(np.bincount(both_src, minlength=n))])
    return xadj, both_dst[order], both_w[order]


def compute_weights(problem: Problem) -> np.ndarray:
    """Vertex weights (integers ≥ 1): each device's share of the cluster's compute π plus its
    share of the memory. Balancing compute alone leaves pools of small-memory GPUs that
    cannot hold the model; balancing the sum keeps both near 1/D per pool."""
    cluster = problem.cluster
    flops = cluster.machine_flops[cluster.machine_of_device]
    memory = cluster.machine_memory_bytes[cluster.machine_of_device]
    share = flops / flops.sum() + memory / memory.sum()
    return np.maximum(np.rint(share * 500 * len(share)), 1).astype(np.int64)


_MACHINE_GRAPHS: dict[tuple, tuple] = {}  # (id(cluster), D) -> (cluster, graph)


def _components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Connected-component label (its smallest vertex) of each of n vertices under edges
    (a, b): label propagation with pointer jumping."""
    label = np.arange(n)
    while True:
        low = np.minimum(label[a], label[b])
        new = label.copy()
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        new = new[new]
        if np.array_equal(new, label):
            return label
        label = new


def machine_graph(problem: Problem, pools: int):
    """The machine graph of a large cluster with every slow link (below the default
    bandwidth) contracted: cut, a slow link would slow the DP sync of every layer its two
    machines hold in different pipelines (bw_min, §3.4); inside one pool the stage order steps
    around it. Components too big for a pool (over machines / 2D) stay apart, their slow links
    kept as the heaviest edges. Returns (group of each machine, CSR adjacency, weights) over
    the groups; edges weighted by bandwidth × device pairs."""
    cluster = problem.cluster
    kept = _MACHINE_GRAPHS.get((id(cluster), pools))
    if kept is not None and kept[0] is cluster:
        return kept[1]
    n = len(cluster.machines)
    mi, mj = _machine_pairs(cluster)
    bw = cluster.pair_bw(mi, mj)
    slow = bw < cluster.inter_bw_gbps
    label = _components(n, mi[slow], mj[slow])
    size = np.bincount(label, minlength=n)
    label = np.where(size[label] * 2 * pools > n, np.arange(n), label)
    _, group = np.unique(label, return_inverse=True)
    weights = np.full(len(mi), SLOW_LINK_WEIGHT, dtype=np.int64)
    if (~slow).any():
        weights[~slow] = _edge_weights(bw[~slow], float(cluster.inter_bw_gbps), float(bw[~slow].max()))
    gi, gj = group[mi], group[mj]
    apart = gi != gj
    keys, inverse = np.unique(np.minimum(gi, gj)[apart] * n + np.maximum(gi, gj)[apart], return_inverse=True)
    merged = np.bincount(inverse, weights=(weights * cluster.machine_counts[mi] * cluster.machine_counts[mj])[apart])
    groups = int(group.max()) + 1
    graph = (group, _to_csr(groups, keys // n, keys % n, np.rint(merged).astype(np.int64)))
    _MACHINE_GRAPHS.clear()
    _MACHINE_GRAPHS[(id(cluster), pools)] = (cluster, graph)
    return graph


def metis_machine_pools(problem: Problem, pools: int, seed: int) -> list[np.ndarray]:
    """D pools of whole machines by METIS on the machine graph (14k vertices at 10^5 GPUs
    instead of 10^5, no device-pair edges, slow links contracted), balanced like `metis_pools`."""
    cluster = problem.cluster
    group, (xadj, adjncy, eweights) = machine_graph(problem, pools)
    machine_weight = np.bincount(cluster.machine_of_device, weights=compute_weights(problem))
    vweights = np.rint(np.bincount(group, weights=machine_weight)).astype(np.int64)
    options = pymetis.Options(seed=seed, ufactor=30, ncuts=1)
    result = pymetis.part_graph(
        pools, adjacency=pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
        vweights=vweights, eweights=eweights, options=options)
    part = np.asarray(result.vertex_part)[group][cluster.machine_of_device]
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(pools + 1))
    return [order[bounds[p]: bounds[p + 1]] for p in range(pools) if bounds[p + 1] > bounds[p]]


def metis_pools(problem: Problem, pools: int, seed: int) -> list[np.ndarray]:
    """D pools of device ids by METIS k-way partitioning, compute-balanced within 3 %
    (on the machine graph above `MACHINE_GRAPH_DEVICES`, while D ≤ machines / 4)."""
    n = problem.cluster.num_devices
    if pools == 1:
        return [np.arange(n)]
    if n > MACHINE_GRAPH_DEVICES and 4 * pools <= len(problem.cluster.machines):
        return metis_machine_pools(problem, pools, seed)
    xadj, adjncy, eweights = device_graph(problem)
    options = pymetis.Options(seed=seed, ufactor=30, ncuts=2)
    result = pymetis.part_graph(
        pools, adjacency=pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
        vweights=compute_weights(problem), eweights=eweights, options=options)
    part = np.asarray(result.vertex_part)
    return [np.flatnonzero(part == p) for p in range(pools) if np.any(part == p)]


def random_pools(problem: Problem, pools: int, seed: int) -> list[np.ndarray]:
    """Baseline: a random split of the devices into D compute-balanced pools.

    Devices are shuffled and dealt, each to the pool with the least compute so far, so the
    pools are as balanced as METIS's but ignore the links entirely."""
    rng = np.random.default_rng(seed)
    weights = compute_weights(problem)
    order = rng.permutation(problem.cluster.num_devices)
    load = np.zeros(pools)
    members: list[list[int]] = [[] for _ in range(pools)]
    for d in order:
        p = int(np.argmin(load))
        members[p].append(int(d))
        load[p] += weights[d]
    return [np.sort(np.array(m)) for m in members if m]


def striped_pools(problem: Problem, pools: int, whole: bool = False) -> list[np.ndarray]:
    """Every machine cut into min(count, D) contiguous blocks, dealt to distinct pools, the
    least-loaded first. Machines go out fastest first, grouped by type, so each pool gets a
    like mix and stage k of every pipeline tends to land on one machine. With `whole`, the
    machines of a (GPU, count) group of a multiple of D machines go out whole, as many to each
    pool: every pool still gets a like mix, and a stage may take a whole machine as its TP
    group (on a generated 24-GPU cluster with two 4-GPU H20 machines, D = 2 with one H20
    machine per pipeline beat both other splits by 4.3 %)."""
    cluster = problem.cluster
    weights = compute_weights(problem)
    order = sorted(range(len(cluster.machines)),
                   key=lambda m: (-cluster.machine_flops[m], cluster.machines[m].gpu, m))
    groups = Counter((cluster.machines[m].gpu, cluster.machines[m].count) for m in order)
    load = np.zeros(pools)
    members: list[list[int]] = [[] for _ in range(pools)]
    for m in order:
        devices = cluster.devices_of(m)
        dealt_whole = whole and groups[(cluster.machines[m].gpu, cluster.machines[m].count)] % pools == 0
        blocks = [np.array(devices)] if dealt_whole else np.array_split(np.array(devices), min(len(devices), pools))
        targets = np.argsort(load, kind="stable")[: len(blocks)]
        for block, p in zip(blocks, sorted(targets)):
            members[p].extend(int(d) for d in block)
            load[p] += weights[block].sum()
    return [np.array(sorted(m)) for m in members if m]


# The tiered splits: pools filled fastest device first, each but the last until it holds this
# many times one replica's model states (a search family, like the TP caps: which fill is best
# depends on how much of the fast pool's memory its activations and its end stages need).
TIERED_HOLDS = (1.0, 1.5, 2.0, 3.0)
TIERED_MODES = {f"tiered×{holds:g}": holds for holds in TIERED_HOLDS}


def tiered_pools(problem: Problem, pools: int, holds: float) -> list[np.ndarray]:
    """Pools of unequal speed: devices fastest first (by machine, then id), each pool but the
    last taking them until its usable memory reaches `holds` × μ·P, the last pool the rest.
    Phase 2 then gives the fast pool's pipeline more micro-batches (HexiScale's asymmetric
    pipelines): on h800-h20-16-24 a pipeline of the 16 H800 (209 micro-batches) beside one of
    the 24 H20 (47) is 4.7 % faster than any striped or METIS split."""
    cluster, training = problem.cluster, problem.training
    need = holds * training.param_state_bytes * problem.model.total_params
    usable = (cluster.machine_memory_bytes - reserve_bytes(training))[cluster.machine_of_device]
    speed = cluster.machine_flops[cluster.machine_of_device]
    order = sorted(range(cluster.num_devices), key=lambda d: (-speed[d], int(cluster.machine_of_device[d]), d))
    members: list[list[int]] = [[]]
    held = 0.0
    for d in order:
        if len(members) < pools and held >= need:
            members.append([])
            held = 0.0
        members[-1].append(d)
        held += usable[d]
    return [np.array(sorted(m)) for m in members]


# The uneven splits: the share of each striped machine that goes to the pool its lone machines
# made the strongest (a search family: 5/8 and 3/4 of an 8-GPU machine are 5 and 6 devices).
UNEVEN_SHARES = (0.625, 0.75)
UNEVEN_MODES = {f"uneven×{share:g}": share for share in UNEVEN_SHARES}


def uneven_pools(problem: Problem, pools: int, share: float) -> list[np.ndarray]:
    """Pools of unequal speed around the *lone* machines, those whose (GPU, count) group has
    fewer machines than D (so "machines" stripes them): each goes out whole, heaviest first, to
    the pool with the least compute so far; then every other machine is cut in D blocks, the
    pool the lone machines made the strongest taking `share` of it and the others the rest in
    equal parts (with no lone machine, the "machines" split stands in). On hetero-1 (a 3090 and
    a 3080 Ti machine beside three 4090 machines), D = 2 with the 3090 and 5 GPUs of each 4090
    machine in one pipeline (77 micro-batches) and the 3080 Ti and 3 of each in the other (51)
    is 16.36 s against the even splits' 17.2–17.7 s: the stronger pipeline's 4090 stages hold
    2 layers each, the other's 3, both near one τ."""
    cluster = problem.cluster
    if pools == 1:
        return [np.arange(cluster.num_devices)]
    weights = compute_weights(problem)
    groups = Counter((m.gpu, m.count) for m in cluster.machines)
    lone = {m for m, machine in enumerate(cluster.machines) if groups[(machine.gpu, machine.count)] < pools}
    if not lone:  # nothing to build the pools around: the "machines" split (the search skips it as a repeat)
        return striped_pools(problem, pools, whole=True)
    load = np.zeros(pools)
    members: list[list[int]] = [[] for _ in range(pools)]
    for m in sorted(lone, key=lambda m: (-weights[cluster.devices_of(m)].sum(), m)):
        p = int(np.argmin(load))
        members[p].extend(cluster.devices_of(m))
        load[p] += weights[cluster.devices_of(m)].sum()
    rank = np.argsort(-load, kind="stable")  # the strongest pool first
    for m in (m for m in range(len(cluster.machines)) if m not in lone):
        devices = list(cluster.devices_of(m))
        first = int(round(share * len(devices)))
        cuts = [first] + [first + round((len(devices) - first) * (j + 1) / (pools - 1)) for j in range(pools - 2)]
        for block, p in zip(np.split(np.array(devices), cuts), rank):
            members[p].extend(int(d) for d in block)
    return [np.array(sorted(m)) for m in members if m]


def partition(problem: Problem, pools: int, *, partitioner: str, protect: Protect, seed: int) -> list[np.ndarray]:
    """D pools of device ids: random (baseline), METIS min-cut ("pipeline"), striped ("data"),
    striped with groups of like machines dealt whole ("machines"), tiered (`TIERED_MODES`) or
    uneven around the lone machines (`UNEVEN_MODES`)."""
    if partitioner == "random":
        return random_pools(problem, pools, seed)
    if protect in ("data", "machines"):
        return striped_pools(problem, pools, whole=protect == "machines")
    if protect in TIERED_MODES:
        return tiered_pools(problem, pools, TIERED_MODES[protect])
    if protect in UNEVEN_MODES:
        return uneven_pools(problem, pools, UNEVEN_MODES[protect])
    return metis_pools(problem, pools, seed)
