"""A lower bound on T_mb of every replica with a given device set: docs/sequence_bounds.md §2.

A replica's *key* is its devices per machine (devices of one machine are interchangeable,
[S1] of docs/formulation.md §7.1). For a key, the terms of docs/sequence-plans.md §7.2 that
do not depend on heads and tokens are exact — Z_layer and Z_ends from N and the key's links
[K1] — and the rest is bounded below by water-filling over whole blocks:
- [K2] L·max Clin_i + max Chead_i ≥ min over u_i ≥ 1, Σ u_i = s/q, of max_i b_i·u_i, b_i the
  seconds of one token block (L linear passes and the head) on member i's device;
- [K3] L·max Catt_i ≥ min over P_i = U_g·h_i ≥ 1, Σ P_i = k·s/2q, of max_i a_i·P_i;
- [K4] every u_i and P_i capped by the memory its device has left after states, gathered
  weights, the reserve and the other term's least share.
The HP all-to-all and the CP ring are bounded by 0. All keys are bounded at once (numpy over
keys); a key whose devices cannot hold the sequence has the bound inf.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from planner.problem import Problem
from planner.sequence import cost

MAX_KEYS = 400_000  # keys enumerated at most (the product of devices per machine + 1)
BISECTIONS = 64  # halvings of the water level's bracket (float precision)

Key = tuple[int, ...]


@dataclass(frozen=True)
class KeyBounds:
    """Every non-empty key (rows of `keys`) with its device count, the exact ZeRO-3 part
    L·Z_layer + Z_ends and the bound on T_mb (inf: no ring of these devices fits)."""

    keys: np.ndarray  # (K, machines) devices per machine
    devices: np.ndarray  # (K,) N
    zero_s: np.ndarray  # (K,) [K1], exact
    compute_s: np.ndarray  # (K,) [K2] + [K3]
    bound_s: np.ndarray  # (K,) zero_s + compute_s

    def finite(self) -> KeyBounds:
        keep = np.isfinite(self.bound_s)
        return KeyBounds(self.keys[keep], self.devices[keep], self.zero_s[keep], self.compute_s[keep],
                         self.bound_s[keep])


@dataclass(frozen=True)
class Coefficients:
    """Per machine: seconds per token block (L linear passes + the head) and per attention
    unit; the bytes a block and a unit hold [K2]–[K4]; how many blocks and units a replica splits."""

    block_s: np.ndarray
    unit_s: np.ndarray
    block_bytes: float
    unit_bytes: float
    blocks: int  # s/q
    units: int  # k·s/2q

    @classmethod
    def of(cls, problem: Problem) -> Coefficients:
        model, training, cluster = problem.model, problem.training, problem.cluster
        q, s, per_kv = training.token_block, training.seq_len, model.heads // model.num_kv_heads
        flops, attention = cluster.machine_flops, cluster.machine_attention_flops
        block = (model.layers * cost.linear_compute_time(model, training, q, flops)
                 + cost.head_compute_time(model, training, q, flops))
        unit = model.layers * cost.attention_compute_time(model, training, q * (s + 1), per_kv, attention)
        block_bytes = (cost.activation_bytes(model, training, q, cost.working_set_bytes(model, training, q, 0, 0))
                       + cost.logits_bytes(model, training, q))
        unit_bytes = cost.activation_bytes(model, training, 0, cost.working_set_bytes(model, training, 0, 2 * q, per_kv))
        return cls(np.asarray(block, float), np.asarray(unit, float), float(block_bytes), float(unit_bytes),
                   s // q, model.num_kv_heads * (s // (2 * q)))


def _taken(level: np.ndarray, per_item_s: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """(K, machines) items a device of each machine takes at `level` (K,): min(cap, ⌊level/c⌋)."""
    return np.minimum(caps, np.floor(level[:, None] / per_item_s[None, :]))


def water_level(keys: np.ndarray, per_item_s: np.ndarray, caps: np.ndarray, total: int) -> np.ndarray:
    """Per key: a lower bound, within float precision, of min over integers 1 ≤ x_i ≤ cap_i with
    Σ x_i = total of max_i c_i·x_i (every device of machine j shares c_j and cap_j, (K, machines));
    inf when no such x exists [K2]. Bisection on the level: it holds when Σ_i min(cap_i, ⌊level/c_i⌋)
    ≥ total (and level ≥ every used c_i); the returned level does not hold."""
    used = keys > 0
    n = keys.sum(axis=1)
    possible = (n <= total) & ((keys * np.maximum(caps, 0)).sum(axis=1) >= total) & ~(used & (caps < 1)).any(axis=1)
    floor = np.where(used, per_item_s[None, :], 0.0).max(axis=1)  # every device takes one item
    lo = np.maximum(floor * (1 - 1e-12), total / np.maximum((keys / per_item_s[None, :]).sum(axis=1), 1e-300))
    lo = lo * (1 - 1e-9)
    hi = np.maximum(lo, floor) * 2 + per_item_s.max() * total

    def holds(level):
        return ((keys * _taken(level, per_item_s, caps)).sum(axis=1) >= total) & (level >= floor)

    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        ok = holds(mid)
        lo, hi = np.where(ok, lo, mid), np.where(ok, mid, hi)
    return np.where(possible, lo, np.inf)


def link_extremes(problem: Problem, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key: the smallest bw and largest latency between two distinct devices of its set
    (`planner.sequence.links.within_sets`: a machine meets itself only through two devices)."""
    m = keys.shape[1]
    idx = np.arange(m)
    bw = np.asarray(problem.cluster.pair_bw(idx[:, None], idx[None, :]), float)
    lat = np.asarray(problem.cluster.pair_lat(idx[:, None], idx[None, :]), float)
    low, high = np.full(len(keys), np.inf), np.zeros(len(keys))
    for i in range(m):
        for j in range(i, m):
            meet = (keys[:, i] >= 2) if i == j else (keys[:, i] > 0) & (keys[:, j] > 0)
            low = np.where(meet, np.minimum(low, bw[i, j]), low)
            high = np.where(meet, np.maximum(high, lat[i, j]), high)
    return low, high


def zero_seconds(problem: Problem, keys: np.ndarray) -> np.ndarray:
    """[K1] L·Z_layer + Z_ends of a replica of each key (exact)."""
    model, training = problem.model, problem.training
    n = keys.sum(axis=1)
    bw, lat = link_extremes(problem, keys)
    bw = np.where(np.isfinite(bw), bw, 1.0)  # one device: ag(1, ·) = 0 whatever the link
    layer = cost.zero_time(training, model.params_per_layer, n, bw, lat)
    ends = cost.zero_time(training, cost.end_params(model), n, bw, lat)
    return cost.zero_micro_batch_time(model, layer, ends)


def bound_keys(problem: Problem, keys: np.ndarray) -> KeyBounds:
    """[K1]–[K4] for the given keys (K, machines)."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1, len(problem.cluster.machines))
    coef, model, training = Coefficients.of(problem), problem.model, problem.training
    n = keys.sum(axis=1)
    fixed = (cost.state_bytes(model, training, n) + cost.gathered_bytes(model, training)
             + cost.reserve_bytes(training))
    room = problem.cluster.machine_memory_bytes[None, :] - fixed[:, None]
    block_cap = np.floor((room - coef.unit_bytes) / coef.block_bytes)
    unit_cap = np.floor((room - coef.block_bytes) / coef.unit_bytes)
    compute = (water_level(keys, coef.block_s, block_cap, coef.blocks)
               + water_level(keys, coef.unit_s, unit_cap, coef.units))
    zero = zero_seconds(problem, keys)
    return KeyBounds(keys, n, zero, compute, zero + compute)


def key_count(problem: Problem) -> int:
    """Π (devices of machine j + 1): the keys `all_keys` lists, the empty one included."""
    return math.prod(m.count + 1 for m in problem.cluster.machines)


def all_keys(problem: Problem) -> np.ndarray:
    """Every non-empty key of the cluster (refused above MAX_KEYS)."""
    counts = [m.count for m in problem.cluster.machines]
    total = key_count(problem)
    if total > MAX_KEYS:
        many = f"{total:,}" if total < 10**12 else f"a {len(str(total))}-digit number of"
        raise ValueError(f"{many} device sets per machine exceed the {MAX_KEYS:,} this bound enumerates")
    keys = np.array(list(itertools.product(*(range(c + 1) for c in counts))), dtype=np.int64)
    return keys[keys.sum(axis=1) > 0]


def key_bounds(problem: Problem) -> KeyBounds:
    """[K1]–[K4] for every key with a finite bound."""
    return bound_keys(problem, all_keys(problem)).finite()
