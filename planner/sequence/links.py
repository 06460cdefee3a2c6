"""Bandwidth and latency between the devices of a sequence plan (docs/plan-space.md §1, docs/sequence-plans.md §7.2): the
smallest bandwidth and largest latency inside each group, between neighbouring groups of a
ring, inside each replica and across replicas.

`link` is the one place that reads the cluster's figures: everything else asks it for the
machine pairs it needs, so a cluster representation other than dense matrices changes only
`link`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.hardware import Cluster


def link(cluster: Cluster, a, b) -> tuple[np.ndarray, np.ndarray]:
    """bw (GB/s) and latency (s) between machines a and b (arrays of machine indices,
    element-wise; a == b gives the machine's intra values)."""
    return cluster.pair_bw(a, b), cluster.pair_lat(a, b)  # sparse on big clusters, never N×N


def _pairs(lo: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j) with j in [lo_i, lo_i + length_i), sorted by i."""
    src = np.repeat(np.arange(len(lo)), length)
    before = np.cumsum(length) - length
    dst = np.arange(len(src)) - np.repeat(before - lo, length)
    return src, dst


@dataclass(frozen=True, eq=False)
class Units:
    """The (set, machine) pairs present in a partition of devices into sets, sorted by set:
    each unit's machine and device count, and where each set's units start. Computed once
    and shared by `within_sets` and `between_sets`."""

    machine: np.ndarray
    count: np.ndarray
    start: np.ndarray  # (num_sets + 1,)

    @classmethod
    def of(cls, num_machines: int, set_of: np.ndarray, machine: np.ndarray, num_sets: int) -> Units:
        keys, counts = np.unique(set_of * num_machines + machine, return_counts=True)
        return cls(keys % num_machines, counts, np.searchsorted(keys // num_machines, np.arange(num_sets + 1)))

    @property
    def size(self) -> np.ndarray:
        return np.diff(self.start)

    def subset(self, sets: np.ndarray) -> Units:
        """The units of the given sets (sorted indices), renumbered 0…len(sets) − 1."""
        lo, size = self.start[sets], self.size[sets]
        take = np.repeat(lo - (np.cumsum(size) - size), size) + np.arange(int(size.sum()))
        return Units(self.machine[take], self.count[take], np.concatenate([[0], np.cumsum(size)]))


FEW_SETS = 16  # up to this many sets, each set's block is read whole (fewer, larger numpy calls)
MANY_UNITS = 64  # a set of more (set, machine) units is read from the pair tables' structure


def within_sets(cluster: Cluster, units: Units):
    """Per set (every set non-empty): the smallest bw and largest latency between two distinct
    devices of the set; (inf, 0) for a set of one device.

    Small sets read their pairs of units (size² each); a set of more than MANY_UNITS units (a
    replica striped over thousands of machines on 10^5 GPUs: 78M pairs, 50 s) reads the extremes
    from the pair tables' structure instead, O(units log units + links) per set."""
    size = units.size
    large = size > MANY_UNITS
    if not large.any():
        return _within_small_sets(cluster, units)
    bw, lat = np.empty(len(size)), np.empty(len(size))
    small = np.flatnonzero(~large)
    if len(small):
        bw[small], lat[small] = _within_small_sets(cluster, units.subset(small))
    for s in np.flatnonzero(large).tolist():
        bw[s], lat[s] = within_set_by_structure(cluster, units, s)
    return bw, lat


def _within_small_sets(cluster: Cluster, units: Units):
    if len(units.start) - 1 <= FEW_SETS:
        return within_sets_by_block(cluster, units)
    return within_sets_by_pairs(cluster, units)


def within_set_by_structure(cluster: Cluster, units: Units, s: int) -> tuple[float, float]:
    """`within_sets` of set s from `PairTable.row_extremes`: each unit's machine once, twice
    where it holds two or more of the set's devices (it then meets itself at its intra figures)."""
    lo, hi = int(units.start[s]), int(units.start[s + 1])
    positions = np.repeat(units.machine[lo:hi], np.minimum(units.count[lo:hi], 2))
    bw = cluster.bw_table.row_extremes(positions, use_max=False)
    lat = cluster.lat_table.row_extremes(positions, use_max=True)
    return bw, max(lat, 0.0)  # one device alone: no pair, latency 0 as the other routes give


def within_sets_by_block(cluster: Cluster, units: Units):
    """`within_sets`, one machine × machine block per set."""
    bw_out, lat_out = np.empty(len(units.start) - 1), np.empty(len(units.start) - 1)
    for s, (lo, hi) in enumerate(zip(units.start[:-1].tolist(), units.start[1:].tolist())):
        machines = units.machine[lo:hi]
        bw, lat = link(cluster, machines[:, None], machines[None, :])
        lonely = np.flatnonzero(units.count[lo:hi] < 2)  # a machine meets itself only through two devices
        bw, lat = np.array(bw, dtype=float), np.array(lat, dtype=float)
        bw[lonely, lonely], lat[lonely, lonely] = np.inf, 0.0
        bw_out[s], lat_out[s] = bw.min(), lat.max()
    return bw_out, lat_out


def within_sets_by_pairs(cluster: Cluster, units: Units):
    """`within_sets`, every pair of units of every set in one flat array (many small sets)."""
    size = units.size
    u_set = np.repeat(np.arange(len(size)), size)
    src, dst = _pairs(units.start[u_set], size[u_set])
    bw, lat = link(cluster, units.machine[src], units.machine[dst])
    alone = (src == dst) & (units.count[src] < 2)  # a machine pairs with itself only through two devices
    cut = np.concatenate([[0], np.cumsum(size * size)[:-1]])
    return (np.minimum.reduceat(np.where(alone, np.inf, bw), cut),
            np.maximum.reduceat(np.where(alone, 0.0, lat), cut))


def between_sets(cluster: Cluster, units: Units, other: np.ndarray):
    """Per set s: the smallest bw and largest latency between a device of s and one of set
    `other[s]` (the previous group of a ring)."""
    size = units.size
    u_set = np.repeat(np.arange(len(size)), size)
    src, dst = _pairs(units.start[other[u_set]], size[other[u_set]])
    bw, lat = link(cluster, units.machine[src], units.machine[dst])
    cut = np.concatenate([[0], np.cumsum(size * size[other])[:-1]])
    return np.minimum.reduceat(bw, cut), np.maximum.reduceat(lat, cut)


FEW_MACHINES = 256  # up to this many machines in use, `across_sets` reads their U × U block


def across_sets(cluster: Cluster, set_of: np.ndarray, machine: np.ndarray, num_sets: int):
    """The smallest bw and largest latency between two devices of different sets (one replica
    against another); (inf, 0) when there is one set. Two sets sharing a machine meet at its
    intra values."""
    if num_sets < 2:
        return np.inf, 0.0
    used, where = np.unique(machine, return_inverse=True)
    if len(used) > FEW_MACHINES:
        return across_sets_by_structure(cluster, used, where, set_of, num_sets)
    member = np.zeros((len(used), num_sets))
    np.add.at(member, (where, set_of), 1.0)
    member = member > 0
    shared = member.astype(float) @ member.T.astype(float)  # sets holding both machines
    count = member.sum(axis=1).astype(float)
    # some set holds m1 and another set holds m2 unless both sit in one and the same single set
    meet = np.outer(count, count) - shared > 0
    bw, lat = link(cluster, used[:, None], used[None, :])
    return float(bw[meet].min()), float(lat[meet].max())


def across_sets_by_structure(cluster: Cluster, used: np.ndarray, where: np.ndarray, set_of: np.ndarray,
                             num_sets: int) -> tuple[float, float]:
    """`across_sets` without the U × U block (100k GPUs: 14k machines, seconds per call): a
    machine held by two or more sets meets every machine, itself at its intra values; one held
    by a single set meets the machines of the other sets. So colour each machine by its only
    set, or by a colour of its own when shared, and read the extremes over the pairs of
    different colours from the pair tables' structure (`PairTable.apart_extreme`)."""
    units = np.unique(np.asarray(where, dtype=np.int64) * num_sets + set_of)
    holder, held_by = units // num_sets, units % num_sets
    count = np.bincount(holder, minlength=len(used))
    only = np.zeros(len(used), dtype=np.int64)
    only[holder] = held_by
    colour = np.where(count == 1, only, num_sets + np.arange(len(used)))
    shared = used[count > 1]
    own_bw, own_lat = link(cluster, shared, shared)
    bw = min(cluster.bw_table.apart_extreme(used, colour, use_max=False), float(np.min(own_bw, initial=np.inf)))
    lat = max(cluster.lat_table.apart_extreme(used, colour, use_max=True), float(np.max(own_lat, initial=-np.inf)))
    return bw, lat
