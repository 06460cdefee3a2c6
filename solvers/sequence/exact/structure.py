"""Ring structures of the exact sequence solver: docs/formulation.md §7.1, [S1] and [S2].

A *structure* is what the CP-SAT model does not choose: the devices of a replica, their
split into groups and the ring order. [S1] devices of one machine are interchangeable, so a
replica's device set is a vector of per-machine counts (its *key*) realised by each
machine's first devices; [S2] rings that are equal as cyclic sequences of machine multisets
are one structure. Link figures of each structure come from `planner.sequence.links`, the
functions the pricing uses."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from planner.problem import Problem
from planner.sequence.links import Units, between_sets, within_sets
from solvers.sequence.brute import set_partitions
from solvers.sequence.space import mixes_vendors, table_of, vendor_of_devices

Key = tuple[int, ...]  # devices taken from each machine


@dataclass(frozen=True)
class RingSpec:
    """One structure: groups of devices in ring order and the links the cost model reads."""

    groups: tuple[tuple[int, ...], ...]
    machine: tuple[tuple[int, ...], ...]  # machine of every member, group by group
    hp_bw: tuple[float, ...]  # bw_g (inf for one member)
    hp_lat: tuple[float, ...]  # α_g
    ring_bw: tuple[float, ...]  # bw_{g−1,g}
    ring_lat: tuple[float, ...]  # lat_{g−1,g}

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for g in self.groups for d in g)


def devices_by_machine(problem: Problem) -> list[list[int]]:
    of = problem.cluster.machine_of_device
    return [np.flatnonzero(of == m).tolist() for m in range(len(problem.cluster.machines))]


def key_of(problem: Problem, devices) -> Key:
    """[S1] the per-machine counts of a device set."""
    counts = np.bincount(problem.cluster.machine_of_device[list(devices)], minlength=len(problem.cluster.machines))
    return tuple(int(c) for c in counts)


def canonical_devices(problem: Problem, key: Key) -> tuple[int, ...]:
    """[S1] the first key[m] devices of every machine m."""
    by = devices_by_machine(problem)
    return tuple(sorted(d for m, c in enumerate(key) for d in by[m][:c]))


def rename(problem: Problem, ring, devices) -> list:
    """The ring (built on `canonical_devices`) moved onto `devices` of the same key [S1]:
    the i-th device of machine m in one set becomes the i-th of machine m in the other."""
    of = problem.cluster.machine_of_device
    src, dst = {}, {}
    for d in sorted(devices):
        dst.setdefault(int(of[d]), []).append(d)
    for d in sorted(m[0] for g in ring for m in g):
        src.setdefault(int(of[d]), []).append(d)
    to = {a: b for m in src for a, b in zip(src[m], dst[m])}
    return [[(to[d], h, t) for d, h, t in g] for g in ring]


def _ring_orders(groups: list[tuple[int, ...]]):
    """[B2] every ring order with the group of the lowest device first."""
    for order in itertools.permutations(range(1, len(groups))):
        yield [groups[0]] + [groups[i] for i in order]


def _cyclic_form(problem: Problem, ring) -> tuple:
    """[S2] the least rotation of the ring as a sequence of sorted machine tuples."""
    of = problem.cluster.machine_of_device
    seq = [tuple(sorted(int(of[d]) for d in g)) for g in ring]
    return min(tuple(seq[i:] + seq[:i]) for i in range(len(seq)))


def structures(problem: Problem, key: Key) -> list[RingSpec]:
    """One ring per class of [S2] over the canonical devices of `key`: groups of ≤ k members,
    none mixing vendors (rule 2)."""
    devices, vendors = canonical_devices(problem, key), vendor_of_devices(problem)
    k, seen, out = problem.model.num_kv_heads, set(), []
    for groups in set_partitions(devices):
        if any(len(g) > k or mixes_vendors([vendors[d] for d in g]) for g in groups):
            continue
        for ring in _ring_orders(groups):
            form = _cyclic_form(problem, ring)
            if form not in seen:
                seen.add(form)
                out.append(spec_of(problem, ring))
    return out


def spec_of(problem: Problem, ring: list[tuple[int, ...]]) -> RingSpec:
    """The link figures of one ring, from the pricing's own link functions."""
    table = table_of([[[(d, 1, 1) for d in g] for g in ring]], [problem.training.micro_batch])
    machine = problem.cluster.machine_of_device[table.device]
    units = Units.of(len(problem.cluster.machines), table.group, machine, table.num_groups)
    hp_bw, hp_lat = within_sets(problem.cluster, units)
    ring_bw, ring_lat = between_sets(problem.cluster, units, table.prev_group)
    of = problem.cluster.machine_of_device
    return RingSpec(tuple(tuple(g) for g in ring), tuple(tuple(int(of[d]) for d in g) for g in ring),
                    tuple(map(float, hp_bw)), tuple(map(float, hp_lat)),
                    tuple(map(float, ring_bw)), tuple(map(float, ring_lat)))
