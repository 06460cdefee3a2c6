"""The `seq-uniform` layouts as starts of the sequence heuristic (docs/sequence-plans.md §7).

The heuristic polishes the best uniform layout, so it is never slower than `seq-uniform`
(`solvers.sequence.baselines`) and beats it wherever an uneven shard, head split or batch
split helps. The layouts are the baseline's own (its device orders, HP degrees n dividing k,
groups packed or inside one machine, every G whose shards split into token blocks, D dividing
B/b), priced faster: replica r of a layout with G groups per ring is the r-th run of G blocks
whatever D is, so each run is priced once (`table_overflow`, many rings per call) and a
layout's T is its first D runs' max m_r·T_mb (batches split by `split_batches`, never worse
than the baseline's equal split) plus T_dp, computed only for layouts that can still win.

Large clusters have hundreds of run families of up to a whole cluster each, more than a short
time limit prices: the first ring of every family is priced first (one call) and the families
are priced in the order that probe ranks them (first ring fits, then its T_mb times the
micro-batches per replica), so the likely best arrive first and the deadline cuts the rest.
Ties between equal layouts still go to the family enumerated first, so with time enough the
result is the same in any pricing order.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from planner.problem import Problem
from planner.sequence import MemberTable
from solvers.sequence.baselines import device_orders, splits_tokens
from solvers.sequence.space import Ring, dp_time, per_cluster, split_batches, table_overflow

UNIFORM = "uniform"  # the deal named in a uniform start's label
BATCH_MEMBERS = 20000  # members priced per call
NVIDIA, AMD = 1, 2  # vendor codes of `vendor_codes`


@dataclass(frozen=True, eq=False)
class Runs:
    """Consecutive runs of G blocks of n devices of one device order (`devices`: runs × G × n),
    each run one replica's uniform ring (a/n heads and s/(G·n) tokens per member); once
    priced, each run's T_mb and memory overflow (≤ 0: fits). `index`: the family's place in
    the enumeration (ties between equal layouts go to the first)."""

    index: int
    degree: int
    groups: int
    heads: int
    tokens: int
    devices: np.ndarray
    tmb: np.ndarray | None = None
    over: np.ndarray | None = None

    def first_rings(self, count: int) -> list[Ring]:
        """The first `count` runs as rings."""
        h, t = self.heads, self.tokens
        return [[[(d, h, t) for d in block] for block in run] for run in self.devices[:count].tolist()]

    @cached_property
    def rings(self) -> list[Ring]:
        return self.first_rings(len(self.devices))

    def priced(self, devices: np.ndarray, tmb: np.ndarray, over: np.ndarray) -> Runs:
        return Runs(self.index, self.degree, self.groups, self.heads, self.tokens, devices, tmb, over)


@lru_cache(maxsize=64)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n, ascending (B/b reaches 100,000 on large clusters: O(√n), kept)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def shard_counts(problem: Problem, most: int) -> list[int]:
    """G = most, most − 1, …, 1 that may split the tokens (`splits_tokens` needs G·2q to divide
    s): the divisors of s/(2q) up to `most`, largest first (not 100k values of G)."""
    s, unit = problem.training.seq_len, 2 * problem.training.token_block
    return [] if s % unit else [g for g in reversed(divisors(s // unit)) if g <= most]


def vendor_codes(problem: Problem) -> np.ndarray:
    """NVIDIA, AMD or 0 per device (read-only: shared between calls)."""
    def codes(cluster) -> np.ndarray:
        code = {"nvidia": NVIDIA, "amd": AMD}
        per_machine = np.array([code.get(cluster.gpu_of(m).vendor.value, 0) for m in range(len(cluster.machines))])
        return per_machine[cluster.machine_of_device]
    return per_cluster("vendor-codes", problem, codes)


def packed_blocks(order: np.ndarray, degree: int) -> np.ndarray:
    """`baselines.packed_blocks` as a (blocks × n) array."""
    whole = len(order) // degree * degree
    return order[:whole].reshape(-1, degree)


def machine_blocks(problem: Problem, order: np.ndarray, degree: int) -> np.ndarray:
    """`baselines.machine_blocks` as a (blocks × n) array: n devices of one machine each,
    machines as they first appear in `order`, a machine's leftover devices idle."""
    machine = problem.cluster.machine_of_device[order]
    first = np.full(len(problem.cluster.machines), len(order))
    np.minimum.at(first, machine, np.arange(len(order)))
    by_machine = np.argsort(first[machine], kind="stable")
    grouped, owner = order[by_machine], machine[by_machine]
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    counts = np.diff(np.r_[starts, len(owner)])
    place = np.arange(len(owner)) - np.repeat(starts, counts)
    return grouped[place < np.repeat(counts // degree * degree, counts)].reshape(-1, degree)


def _usable(problem: Problem, blocks: np.ndarray, groups: int, most: int) -> np.ndarray:
    """The first (at most `most`) runs of G blocks, up to the first with a group that mixes
    vendors (§8: the all-to-all has no cross-vendor route)."""
    runs = min(most, len(blocks) // groups)
    devices = blocks[:runs * groups].reshape(runs, groups, -1)
    codes = vendor_codes(problem)[devices]
    mixed = ((codes == NVIDIA).any(axis=2) & (codes == AMD).any(axis=2)).any(axis=1)
    return devices[:int(np.argmax(mixed)) if mixed.any() else runs]


def families(problem: Problem) -> list[Runs]:
    """Every distinct run family the baseline's layouts use (B/b runs at most), unpriced,
    in the baseline's order."""
    micro = problem.training.global_batch // problem.training.micro_batch
    seen: set[tuple] = set()
    out: list[Runs] = []
    for order in device_orders(problem):
        order = np.asarray(order, dtype=np.int64)
        for degree in divisors(problem.model.num_kv_heads):
            for blocks in (packed_blocks(order, degree), machine_blocks(problem, order, degree)):
                for groups in shard_counts(problem, len(blocks)):
                    if not splits_tokens(problem, groups, degree):
                        continue
                    used = min(micro, len(blocks) // groups) * groups
                    key = (groups, degree, blocks[:used].tobytes())
                    if key not in seen:
                        seen.add(key)
                        devices = _usable(problem, blocks, groups, micro)
                        if len(devices):
                            out.append(Runs(len(out), degree, groups, problem.model.heads // degree,
                                            problem.training.seq_len // (groups * degree), devices))
    return out


def _price(problem: Problem, pending: list[Runs], first_only: bool = False) -> list[Runs]:
    """The runs of `pending` (or only their first runs) priced in one table."""
    if not pending:
        return []
    parts = [f.devices[:1] if first_only else f.devices for f in pending]
    heads = [np.full(p.size, f.heads) for f, p in zip(pending, parts)]
    tokens = [np.full(p.size, f.tokens) for f, p in zip(pending, parts)]
    groups = [np.full(p.shape[0] * f.groups, f.degree) for f, p in zip(pending, parts)]
    rings = [np.full(p.shape[0], f.groups) for f, p in zip(pending, parts)]
    replicas = sum(p.shape[0] for p in parts)
    table = MemberTable.from_arrays(np.concatenate([p.ravel() for p in parts]), np.concatenate(heads),
                                    np.concatenate(tokens), np.concatenate(groups), np.concatenate(rings),
                                    [problem.training.micro_batch] * replicas)
    tmb, over = table_overflow(problem, table)
    cuts = np.cumsum([0] + [p.shape[0] for p in parts])
    return [f.priced(p, tmb[a:b], over[a:b]) for f, p, a, b in zip(pending, parts, cuts[:-1], cuts[1:])]


def probe_order(problem: Problem, unpriced: list[Runs]) -> list[Runs]:
    """Families ranked by their first ring: fitting ones first, then by its T_mb times the
    micro-batches per replica of the family's largest D (the likely best layouts first)."""
    micro = problem.training.global_batch // problem.training.micro_batch
    probes = _price(problem, unpriced, first_only=True)
    def rank(f: Runs, probe: Runs) -> tuple:
        most = max(d for d in divisors(micro) if d <= len(f.devices))
        return bool(probe.over[0] > 0), -(-micro // most) * float(probe.tmb[0]), f.index
    return [f for _, f in sorted(((rank(f, p), f) for f, p in zip(unpriced, probes)), key=lambda x: x[0])]


def priced_runs(problem: Problem, deadline: float, give_up: float = math.inf) -> list[Runs]:
    """Every family of `families` priced, in `probe_order`, BATCH_MEMBERS members per call
    (while time lasts: at least one batch unless `give_up` has passed)."""
    out: list[Runs] = []
    pending: list[Runs] = []
    members = 0
    for family in probe_order(problem, families(problem)):
        now = time.perf_counter()
        if out and now > deadline or now > give_up:
            return out
        pending.append(family)
        members += family.devices.size
        if members >= BATCH_MEMBERS:
            out += _price(problem, pending)
            pending, members = [], 0
    return out + _price(problem, pending)


def _bounds(micro: int, run: Runs) -> Iterator[tuple[float, int]]:
    """(a lower bound on the compute part, D) of every layout of `run` that fits: max_r m_r·T_mb
    ≥ M / Σ_r 1/T_mb (Σ m_r = M) and ≥ every T_mb (m_r ≥ 1)."""
    fitting = int(np.argmax(run.over > 0)) if (run.over > 0).any() else len(run.over)
    rate, slowest = np.cumsum(1.0 / run.tmb), np.maximum.accumulate(run.tmb)
    for d in (d for d in divisors(micro) if d <= fitting):
        yield max(micro / rate[d - 1], slowest[d - 1]) * (1 - 1e-9), d


def layouts(problem: Problem, runs: list[Runs]) -> Iterator[tuple[float, int, Runs, int, list[int]]]:
    """(compute part max m_r·T_mb, family index, runs, D, batches) of every uniform layout that
    fits, fastest first (ties: the family enumerated first, then the smaller D). Best-first
    over lower bounds: a layout's batches are split only when it may come next."""
    training = problem.training
    micro = training.global_batch // training.micro_batch
    heap = [(bound, run.index, d, i, None) for i, run in enumerate(runs) for bound, d in _bounds(micro, run)]
    heapq.heapify(heap)  # (index, d) is unique: the batches (last) are never compared
    while heap:
        value, index, d, i, m = heapq.heappop(heap)
        run = runs[i]
        if m is not None:
            yield value, index, run, d, [x * training.micro_batch for x in m]
            continue
        tmb = run.tmb[:d].tolist()
        m = split_batches(micro, tmb)
        heapq.heappush(heap, (max(x * t for x, t in zip(m, tmb)), index, d, i, m))


def best_uniform(problem: Problem, deadline: float, give_up: float = math.inf, keep: int = 1) -> list[tuple]:
    """The `keep` fastest uniform layouts that fit, as heuristic candidates ((0, T), batches,
    rings, (−1, n, D, "uniform")), fastest first: T_dp is added only while the compute part
    alone can still beat the keep-th best; past the deadline once one is found, past
    `give_up` at once."""
    best: list[tuple] = []
    for compute, _, run, d, batches in layouts(problem, priced_runs(problem, deadline, give_up)):
        now = time.perf_counter()
        if len(best) >= keep and compute >= best[keep - 1][0][1] or best and now > deadline or now > give_up:
            break
        rings = run.first_rings(d)
        t = compute + dp_time(problem, rings)
        best = sorted(best + [((0.0, t), batches, rings, (-1, run.degree, d, UNIFORM))], key=lambda c: c[0])[:keep]
    return best
