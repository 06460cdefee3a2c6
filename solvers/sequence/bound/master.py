"""The configuration bound: the least T over every set of replicas, each priced at a lower
bound of its key's T_mb — docs/sequence_bounds.md §3.

T = max_r m_r·T_mb(r) + T_dp [7.2], and T_dp depends only on D, min_r N_r and the machines
each replica uses, so it is exact given the keys. A configuration is a multiset of keys that
fit the cluster's devices per machine together with its batch split; its value, with every
T_mb replaced by a lower bound ℓ, is a lower bound on the T of every plan with those
replicas [C1]. The least value over all configurations is found by best-first branch and
bound over multisets of keys (keys in a fixed order, a child never takes an earlier key:
each multiset once [C2]); a node's bound [C3] holds for every configuration below it:
  max_r m_r·ℓ_r ≥ τ*, the least τ with Σ_{r chosen} ⌊τ/ℓ_r⌋ + τ·rate(rest) ≥ M,
where rate(rest) = Σ_j c'_j·v_j bounds Σ 1/ℓ over any replicas still to come (v_j the most
rate per device of machine j any later key gives, [C4]), plus T_dp of the chosen replicas,
which only grows as replicas are added (more of them, fewer devices in the smallest, a
slower link between two). Nodes at or above the incumbent are cut.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np

from planner.problem import Problem
from planner.sequence import cost
from solvers.sequence.space import split_batches

BISECTIONS = 60


@dataclass(frozen=True)
class Columns:
    """Keys in search order with their lower bounds ℓ and [C4]'s rates per device."""

    keys: np.ndarray  # (K, machines)
    devices: np.ndarray  # (K,)
    bound_s: np.ndarray  # (K,) ℓ
    suffix_rate: np.ndarray  # (K + 1, machines): v_j over keys from this index on

    @classmethod
    def of(cls, problem: Problem, keys: np.ndarray, bound_s: np.ndarray) -> Columns:
        """Keys ordered by device-seconds per micro-batch (ℓ·N), the likely best first."""
        order = np.lexsort((np.arange(len(keys)), bound_s * keys.sum(axis=1)))
        keys, bound_s = keys[order], bound_s[order]
        speed = problem.cluster.machine_flops[None, :] * (keys > 0)
        share = speed / np.maximum((keys * speed).sum(axis=1, keepdims=True), 1e-300)
        per_device = share / bound_s[:, None]  # v_{κ,j}: Σ_j κ_j·v_{κ,j} = 1/ℓ_κ
        suffix = np.zeros((len(keys) + 1, keys.shape[1]))
        if len(keys):
            suffix[:-1] = np.maximum.accumulate(per_device[::-1], axis=0)[::-1]
        return cls(keys, keys.sum(axis=1), bound_s, suffix)


@dataclass(order=True)
class Node:
    bound: float
    chosen: tuple[int, ...] = field(compare=False)  # column indices, non-decreasing
    rest: np.ndarray = field(compare=False)  # devices left per machine
    used: np.ndarray = field(compare=False)  # machines some chosen replica uses
    bw: float = field(compare=False)  # smallest bw between two chosen replicas
    lat: float = field(compare=False)


@dataclass
class MasterResult:
    bound_s: float  # the least configuration value (a lower bound on T), or the incumbent
    best: tuple[float, tuple[int, ...], list[int]] | None  # value, column indices, micro-batches
    complete: bool  # every node was explored or cut
    nodes: int


def _links(problem: Problem):
    m = len(problem.cluster.machines)
    idx = np.arange(m)
    return (np.asarray(problem.cluster.pair_bw(idx[:, None], idx[None, :]), float),
            np.asarray(problem.cluster.pair_lat(idx[:, None], idx[None, :]), float))


def least_makespan(chosen_s: np.ndarray, candidate_s: np.ndarray, rate: np.ndarray, micro: int) -> np.ndarray:
    """Per candidate c [C3]: the largest τ (within float precision) with
    Σ_r ⌊τ/ℓ_r⌋ + ⌊τ/ℓ_c⌋ + τ·rate_c < M: every τ reaching M micro-batches lies above it."""
    lo = np.zeros(len(candidate_s))
    hi = np.full(len(candidate_s), float(micro) * float(max(candidate_s.max(initial=0.0), chosen_s.max(initial=0.0))))
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        taken = np.floor(mid / candidate_s) + mid * rate
        if len(chosen_s):
            taken += np.floor(mid[:, None] / chosen_s[None, :]).sum(axis=1)
        ok = taken >= micro
        lo, hi = np.where(ok, lo, mid), np.where(ok, mid, hi)
    return lo


class Master:
    """Best-first branch and bound over configurations of `columns` [C1]–[C4]."""

    def __init__(self, problem: Problem, columns: Columns):
        self.problem, self.columns = problem, columns
        self.micro = problem.training.global_batch // problem.training.micro_batch
        self.capacity = problem.cluster.machine_counts.astype(np.int64)
        self.bw, self.lat = _links(problem)

    def dp(self, replicas: int, min_devices, bw, lat):
        model, training = self.problem.model, self.problem.training
        return np.where(replicas > 1, cost.dp_time(model, training, replicas, min_devices,
                                                   np.where(np.isfinite(bw), bw, 1.0), lat), 0.0)

    def children(self, node: Node, cutoff: float) -> list[Node]:
        """Every node adding one column at or after the last chosen one, with its bound [C3]."""
        c = self.columns
        start = node.chosen[-1] if node.chosen else 0
        if len(node.chosen) >= self.micro:
            return []
        idx = start + np.flatnonzero((c.keys[start:] <= node.rest).all(axis=1) & (c.bound_s[start:] < cutoff))
        if not len(idx):
            return []
        keys = c.keys[idx]
        rest = node.rest[None, :] - keys
        rate = (rest * c.suffix_rate[idx]).sum(axis=1)
        chosen_s = c.bound_s[list(node.chosen)]
        tau = least_makespan(chosen_s, c.bound_s[idx], rate, self.micro)
        meet = (keys[:, :, None] > 0) & node.used[None, None, :]
        bw = np.minimum(node.bw, np.where(meet, self.bw[None], np.inf).min(axis=(1, 2)))
        lat = np.maximum(node.lat, np.where(meet, self.lat[None], 0.0).max(axis=(1, 2)))
        least_n = np.minimum(c.devices[list(node.chosen)].min(initial=1 << 30), c.devices[idx])
        bound = tau + self.dp(len(node.chosen) + 1, least_n, bw, lat)
        keep = np.flatnonzero(bound < cutoff)
        return [Node(float(bound[i]), node.chosen + (int(idx[i]),), rest[i], node.used | (keys[i] > 0),
                     float(bw[i]), float(lat[i])) for i in keep]

    def value(self, node: Node) -> tuple[float, list[int]]:
        """The configuration's value: the exact batch split on ℓ plus T_dp [C1]."""
        chosen_s = self.columns.bound_s[list(node.chosen)].tolist()
        m = split_batches(self.micro, chosen_s)
        least_n = int(self.columns.devices[list(node.chosen)].min())
        dp = float(self.dp(len(node.chosen), least_n, node.bw, node.lat))
        return max(k * t for k, t in zip(m, chosen_s)) + dp, m

    def solve(self, incumbent: float, deadline: float, tolerance: float = 0.0) -> MasterResult:
        """The least value below `incumbent`; nodes within `tolerance` (relative) of the best
        value so far are cut too, and the bound returned then holds to that tolerance."""
        root = Node(0.0, (), self.capacity.copy(), np.zeros(len(self.capacity), bool), math.inf, 0.0)
        heap, best, nodes = [root], None, 0
        cutoff = incumbent
        while heap:
            if time.perf_counter() > deadline:
                return MasterResult(min(heap[0].bound, cutoff), best, False, nodes)
            node = heapq.heappop(heap)
            if node.bound >= cutoff * (1 - tolerance):
                break
            nodes += 1
            if node.chosen:
                value, m = self.value(node)
                if value < cutoff:
                    best, cutoff = (value, node.chosen, m), value
            for child in self.children(node, cutoff * (1 - tolerance)):
                heapq.heappush(heap, child)
        floor = min(heap[0].bound, cutoff) if heap else cutoff
        return MasterResult(min(floor, cutoff), best, True, nodes)
