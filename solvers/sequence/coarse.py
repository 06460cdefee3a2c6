"""Stage 1 of HexiSeq's two-stage scheduler: the global coarse placement (docs/sequence-plans.md §7).

Groups come from fast-link device sets (a machine's devices, cut into groups of at most the
head-parallel degree); the groups are dealt to D replicas in contiguous runs of equal speed
(so a replica keeps whole machines where it can); each ring is ordered by a greedy top-τ
search over link bandwidth; each group gets a shard proportional to its speed. Stage 2
(`fine_split`) splits a group's heads and tokens over its members.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from planner.problem import Problem
from solvers.sequence.shard_memory import ShardDeal, fit_shards, proportional, rings_fit
from solvers.sequence.space import (Ring, compositions, micro_batch_times, per_cluster, plan_time, split_batches,
                                    table_of)

TAU = 4  # ring starts tried by the greedy order search
MAX_FINE = 256  # largest (heads × tokens) split enumerated exactly per group


def machine_groups(problem: Problem, devices: Sequence[int], degree: int) -> list[list[int]]:
    """The devices of each machine (in machine order) cut into groups of `degree` (at most k
    members: each holds a kv head)."""
    size = max(1, min(degree, problem.model.num_kv_heads))
    ids = np.asarray(devices, dtype=np.int64)
    machine = problem.cluster.machine_of_device[ids]
    order = np.lexsort((ids, machine))  # by machine, then device (100k devices: numpy, not a loop)
    ids, machine = ids[order], machine[order]
    starts = np.flatnonzero(np.r_[True, machine[1:] != machine[:-1]]) if len(ids) else np.zeros(0, dtype=np.int64)
    place = np.arange(len(ids)) - np.repeat(starts, np.diff(np.r_[starts, len(ids)]))
    cuts = np.flatnonzero(place % size == 0).tolist() + [len(ids)]
    flat = ids.tolist()
    return [flat[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def device_speed(problem: Problem) -> np.ndarray:
    """π of every device's machine (read-only: shared between calls)."""
    return per_cluster("speed", problem, lambda c: c.machine_flops[c.machine_of_device])


# what the contiguous runs of `deal_replicas` equalise; "striped": every D-th group, so that
# each replica holds a slice of every machine and GPU type (docs/sequence_bounds.md §5: equal
# mixed replicas split the micro-batches evenly where one-type replicas cannot)
DEALS = ("speed", "devices", "striped")


def deal_replicas(problem: Problem, groups: list[list[int]], replicas: int,
                  by: str = "speed") -> list[list[list[int]]] | None:
    """Contiguous runs of groups, one per replica, of about equal speed (`by="speed"`) or
    device count (`by="devices"`: equal ZeRO-3 shards), or every D-th group (`by="striped"`);
    None when a run would be empty."""
    if replicas > len(groups):
        return None
    if by == "striped":
        return [groups[r::replicas] for r in range(replicas)]
    speed = device_speed(problem)
    weight = np.array([speed[g].sum() if by == "speed" else len(g) for g in groups], dtype=float)
    cum = np.cumsum(weight) - weight / 2
    target = np.minimum((cum / weight.sum() * replicas).astype(int), replicas - 1)
    out: list[list[list[int]]] = [[] for _ in range(replicas)]
    for g, r in zip(groups, target.tolist()):
        out[r].append(g)
    return out if all(out) else None


def group_links(problem: Problem, groups: list[list[int]]) -> np.ndarray:
    """bw between every two groups (smallest between their machines); −inf on the diagonal."""
    cluster, machine = problem.cluster, problem.cluster.machine_of_device
    if all(len(set(machine[g].tolist())) == 1 for g in groups):
        of = machine[[g[0] for g in groups]]
        bw = np.array(cluster.pair_bw(of[:, None], of[None, :]), dtype=float)
    else:
        sets = [np.unique(machine[g]) for g in groups]
        bw = np.array([[float(cluster.pair_bw(a[:, None], b[None, :]).min()) for b in sets] for a in sets])
    np.fill_diagonal(bw, -np.inf)
    return bw


def _greedy_order(bw: np.ndarray, start: int) -> list[int]:
    free = np.ones(len(bw), dtype=bool)
    order = [start]
    free[start] = False
    for _ in range(len(bw) - 1):
        row = np.where(free, bw[order[-1]], -np.inf)
        order.append(int(np.argmax(row)))
        free[order[-1]] = False
    return order


def _best_order(bw: np.ndarray, tau: int) -> list[int]:
    """The greedy order (from each of τ evenly spread starts) whose slowest link, then total
    link bandwidth, is largest."""
    best, best_key = list(range(len(bw))), None
    for start in sorted(set(np.linspace(0, len(bw) - 1, min(tau, len(bw))).astype(int).tolist())):
        order = _greedy_order(bw, start)
        links = bw[np.roll(order, 1), order]
        key = (float(links.min()), float(links.sum()))
        if best_key is None or key > best_key:
            best, best_key = order, key
    return best


def order_ring(problem: Problem, groups: list[list[int]], tau: int = TAU) -> list[list[int]]:
    """A ring order by greedy search over link bandwidth: from each of τ starts, append the
    group with the fastest link to the last one; keep the ring whose slowest link (closing
    one included) is fastest, then the one with the largest total. When every group lies in
    one machine the machines are ordered so (a machine's groups stay together, their links
    are its own)."""
    if len(groups) <= 2:
        return groups
    machine = problem.cluster.machine_of_device
    if not all(len(set(machine[g].tolist())) == 1 for g in groups):
        return [groups[i] for i in _best_order(group_links(problem, groups), tau)]
    of = [int(machine[g[0]]) for g in groups]
    machines = list(dict.fromkeys(of))
    bw = np.array(problem.cluster.pair_bw(np.array(machines)[:, None], np.array(machines)[None, :]), dtype=float)
    np.fill_diagonal(bw, -np.inf)
    order = _best_order(bw, tau) if len(machines) > 2 else list(range(len(machines)))
    by_machine: dict[int, list[list[int]]] = {}
    for g, m in zip(groups, of):
        by_machine.setdefault(m, []).append(g)
    return [g for i in order for g in by_machine[machines[i]]]


def shard_units(problem: Problem, groups: list[list[int]]) -> list[int] | None:
    """Shard units (2q tokens each) of every group, proportional to its speed; ≥ ⌈n_g/2⌉ each."""
    return proportional(group_speeds(problem, groups), problem.training.seq_len // (2 * problem.training.token_block),
                        least_units(groups))


def group_speeds(problem: Problem, groups: list[list[int]]) -> list[float]:
    speed = device_speed(problem)
    return [float(speed[g].sum()) for g in groups]


def least_units(groups: list[list[int]]) -> list[int]:
    """⌈n_g/2⌉ shard units per group: each member holds at least one token block."""
    return [math.ceil(len(g) / 2) for g in groups]


def shards_cover(problem: Problem, groups: list[list[int]]) -> bool:
    """Whether the s/(2q) shard units cover these groups (`shard_units` is not None)."""
    return sum(least_units(groups)) <= problem.training.seq_len // (2 * problem.training.token_block)


def fine_split(problem: Problem, devices: list[int], units: int) -> list[tuple[int, int, int]] | None:
    """Stage 2 for one group: kv heads and token blocks per member. Exactly (least
    max_i t_i/π_i, then least max_i heads_i/π_i) when the split space is small, else
    proportional to speed; None when the group has more members than kv heads or blocks."""
    model, q = problem.model, problem.training.token_block
    per_kv, k = model.heads // model.num_kv_heads, model.num_kv_heads
    speed = tuple(device_speed(problem)[devices].tolist())
    if len(devices) > k or len(devices) > 2 * units:
        return None
    heads, tokens = _split(speed, k, 2 * units)
    return [(d, per_kv * h, q * t) for d, h, t in zip(devices, heads, tokens)]


@lru_cache(maxsize=4096)
def _split(speed: tuple[float, ...], kv: int, blocks: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """kv heads and token blocks over members of these speeds (see `fine_split`)."""
    n, pace = len(speed), np.array(speed)
    if math.comb(kv - 1, n - 1) * math.comb(blocks - 1, n - 1) <= MAX_FINE:
        heads = min(compositions(kv, n), key=lambda c: (max(np.array(c) / pace), c))
        tokens = min(compositions(blocks, n), key=lambda c: (max(np.array(c) / pace), c))
        return heads, tokens
    return tuple(proportional(speed, kv, [1] * n)), tuple(proportional(speed, blocks, [1] * n))


def coarse_ring(problem: Problem, groups: list[list[int]]) -> Ring | None:
    """Order, shard and split one replica's groups (None when the shards cannot cover them)."""
    return coarse_rings(problem, [groups])[0]


def coarse_rings(problem: Problem, dealt: list[list[list[int]]], until: float = math.inf) -> list[Ring | None] | None:
    """`coarse_ring` of every replica's groups: shards by speed, and where a ring is then over
    memory, capped by it (`shard_memory.fit_shards`); one memory check covers every ring.
    None when the clock (`time.perf_counter`) passes `until` while the rings are ordered: one
    plan's ordering is O(Σ machines²) and took 4.6 s where the plans before it took 0.3 s
    (10^5 GPUs striped over 128 replicas, 781 machines a ring), so no earlier step predicts it."""
    ordered = []
    for groups in dealt:
        if time.perf_counter() > until:
            return None
        ordered.append(order_ring(problem, groups))
    units = [shard_units(problem, groups) for groups in ordered]
    rings = [None if u is None else _split_ring(problem, g, u) for g, u in zip(ordered, units)]
    built = [i for i, ring in enumerate(rings) if ring is not None]
    fits = rings_fit(problem, [rings[i] for i in built]).tolist() if built else []
    over = [i for i, ok in zip(built, fits) if not ok]
    deals = [ShardDeal(group_speeds(problem, ordered[i]), least_units(ordered[i]), units[i],
                       lambda parts, i=i: _split_ring(problem, ordered[i], parts), ring=rings[i]) for i in over]
    for i, fitted in zip(over, fit_shards(problem, deals)):
        rings[i] = fitted or rings[i]
    return rings


def _split_ring(problem: Problem, ordered: list[list[int]], units: list[int]) -> Ring | None:
    """Stage 2 over a ring's groups with these shard units (None where a group cannot split)."""
    ring = [fine_split(problem, g, u) for g, u in zip(ordered, units)]
    return None if any(g is None for g in ring) else ring


def join_ring(problem: Problem, rings: list[Ring], r: int,
              devices: Sequence[int]) -> tuple[float, list[int], list[Ring]] | None:
    """(T, batches, rings) with `devices` as more groups of replica r's ring (of its HP degree),
    that ring ordered and its shards dealt by speed again (`coarse_rings`), the other rings as
    they are and the micro-batches split again; None where the ring cannot be built or does
    not fit in memory."""
    degree = max(len(g) for g in rings[r])
    groups = [[member[0] for member in g] for g in rings[r]] + machine_groups(problem, devices, degree)
    ring = coarse_rings(problem, [groups])[0]
    if ring is None:
        return None
    joined = rings[:r] + [ring] + rings[r + 1:]
    times = micro_batch_times(problem, table_of(joined, [1] * len(joined)))
    split = split_batches(problem.training.micro_batches, times)
    if split is None:
        return None
    batches = [m * problem.training.micro_batch for m in split]
    t, fits = plan_time(problem, batches, joined)
    return (t, batches, joined) if fits else None


def devices_by_speed(problem: Problem) -> list[int]:
    """Devices, fastest GPU type first (then by machine and index)."""
    flops = device_speed(problem)
    machine = problem.cluster.machine_of_device
    return np.lexsort((np.arange(len(flops)), machine, -flops)).tolist()


def growth_machines(problem: Problem, devices: Sequence[int], per_type: int = 1) -> list[list[int]]:
    """Idle machines that may join `devices`, per GPU type among the idle ones the `per_type`
    best linked to the machines in use (largest slowest link to them, then most devices, then
    first in the file), so that a plan grows where its rings and replicas stay fast: one list
    per type, types in the order of their best machine."""
    cluster = problem.cluster
    used = np.unique(cluster.machine_of_device[list(devices)])
    idle = np.setdiff1d(np.arange(len(cluster.machines)), used)
    if not len(idle) or not len(used):
        return []
    slowest = cluster.bw_table.toward(idle, used, use_max=False)  # no idle × used matrix: 24M pairs at 10^5 GPUs
    by_type: dict[str, list[tuple]] = {}
    for m, bw in zip(idle.tolist(), slowest.tolist()):
        by_type.setdefault(cluster.machines[m].gpu, []).append((-bw, -int(cluster.machine_counts[m]), m))
    ranked = [sorted(keys)[:per_type] for keys in by_type.values()]
    return [[key[2] for key in keys] for keys in sorted(ranked, key=lambda keys: keys[0][2])]


def degrees(problem: Problem) -> list[int]:
    """HP degrees tried: 1, 2, 4, … up to min(k, the largest machine), and that maximum."""
    top = min(problem.model.num_kv_heads, int(problem.cluster.machine_counts.max()))
    out = sorted({2 ** i for i in range(int(math.log2(top)) + 1)} | {top})
    return out


def replica_counts(problem: Problem, groups: int, limit: int = 8) -> list[int]:
    """D tried: 1, 2, 3, 4, 6, 8, … up to min(#groups, B/b), at most `limit` values."""
    top = min(groups, problem.training.global_batch // problem.training.micro_batch)
    base = sorted({d for d in itertools.chain([1, 2, 3, 4, 6], (2 ** i for i in range(3, 12))) if d <= top} | {top})
    if len(base) <= limit:
        return base
    return base[: limit - 1] + [top]
