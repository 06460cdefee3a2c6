"""Brute force for tiny sequence problems: every valid plan of docs/sequence-plans.md §7.1, priced by the
planner, the best kept — the independent oracle of the heuristic's and exact models' tests. It
honours the objective (least T, least T within the budget, least cost per token) and gives the
time–rent frontier from the best plan of every rented machine set (`solvers.brute_objective`).

Enumerated: which devices are used and how they split into replicas; each replica's groups
(set partitions, no group mixing vendors), their ring order, heads and tokens per member;
the batch of each replica. Two facts keep it small, both exact:
- [B1] every §7.2–§7.3 term but T_dp depends only on the replica's own ring, T_rep = m_r·T_mb
  and T_dp only on which devices form the replicas: the best ring of a device set is found
  once (least T_mb among those that fit) and T = min over batch splits of max_r m_r·T_mb(r) + T_dp.
- [B2] a ring's rotation changes no term (only the cyclic predecessor is priced), so the
  group holding the set's lowest device comes first; members' order in a group changes no term.
"""

from __future__ import annotations

import itertools
import time
from functools import lru_cache

import numpy as np

from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.brute_objective import BestPerMachineSet, BrutePoint, brute_frontier, brute_result
from solvers.common import SolveResult, SolverOptions
from solvers.sequence.space import (Ring, compositions, memory_proof, mixes_vendors, plan_of, plan_time,
                                    ring_times, vendor_of_devices)
from planner.base import plural

MAX_DEVICES, MAX_UNITS, CHUNK = 5, 8, 4096
# every split of B/b micro-batches over the replicas is enumerated: B/b = 10⁸ filled 12 GB
MAX_MICRO_BATCHES = 64


def set_partitions(items: tuple[int, ...]):
    """Every partition of `items` into non-empty blocks (blocks in order of their first item)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [(first,)] + part
        for i in range(len(part)):
            yield part[:i] + [(first,) + part[i]] + part[i + 1:]


def _heads_options(problem: Problem, size: int) -> list[tuple[int, ...]]:
    per_kv = problem.model.heads // problem.model.num_kv_heads
    return [tuple(per_kv * c for c in comp) for comp in compositions(problem.model.num_kv_heads, size)]


def _rings_of_groups(problem: Problem, groups: list[tuple[int, ...]]):
    """Every ring over these groups [B2]: orders with groups[0] first, heads, tokens."""
    q, units = problem.training.token_block, problem.training.seq_len // (2 * problem.training.token_block)
    heads = [_heads_options(problem, len(g)) for g in groups]
    for order in itertools.permutations(range(1, len(groups))):
        ring = [groups[0]] + [groups[i] for i in order]
        ring_heads = [heads[0]] + [heads[i] for i in order]
        for shares in compositions(units, len(ring)):
            tokens = [[tuple(q * c for c in comp) for comp in compositions(2 * u, len(g))]
                      for u, g in zip(shares, ring)]
            for hs in itertools.product(*ring_heads):
                for ts in itertools.product(*tokens):
                    yield [list(zip(g, h, t)) for g, h, t in zip(ring, hs, ts)]


def _rings_of_set(problem: Problem, devices: tuple[int, ...]):
    vendors, k = vendor_of_devices(problem), problem.model.num_kv_heads
    for groups in set_partitions(devices):
        if all(len(g) <= k and not mixes_vendors([vendors[d] for d in g]) for g in groups):
            yield from _rings_of_groups(problem, groups)


def best_ring(problem: Problem, devices: tuple[int, ...]) -> tuple[float, Ring] | None:
    """The least T_mb over every ring of exactly these devices that fits in memory [B1]."""
    best: tuple[float, Ring] | None = None
    rings = _rings_of_set(problem, devices)
    while chunk := list(itertools.islice(rings, CHUNK)):
        tmb, fits = ring_times(problem, chunk)
        tmb = np.where(fits, tmb, np.inf)
        i = int(np.argmin(tmb))
        if np.isfinite(tmb[i]) and (best is None or tmb[i] < best[0]):
            best = (float(tmb[i]), chunk[i])
    return best


def best_batches(micro_batches: int, tmb: list[float]) -> tuple[float, list[int]] | None:
    """min over every split m_r ≥ 1, Σ m_r = M, of max_r m_r·T_mb(r)."""
    options = ((max(m * t for m, t in zip(comp, tmb)), list(comp)) for comp in compositions(micro_batches, len(tmb)))
    return min(options, default=None)


def _too_big(problem: Problem) -> str | None:
    n = problem.cluster.num_devices
    units = problem.training.seq_len // (2 * problem.training.token_block)
    micro = problem.training.micro_batches
    if n > MAX_DEVICES or units > MAX_UNITS or micro > MAX_MICRO_BATCHES:
        return (f"brute force handles ≤ {MAX_DEVICES} devices, ≤ {MAX_UNITS} shard units s/(2q) and ≤ "
                f"{MAX_MICRO_BATCHES} micro-batches B/b; this problem has {plural(n, 'device')}, {units} units and "
                f"{micro:,} micro-batch{'es' if micro != 1 else ''}")
    return None


def best_per_machine_set(problem: Problem) -> list[BrutePoint]:
    """Every rented machine set's least-T plan, priced (docs/prices.md §13): each used device set
    rents the machines holding it."""
    training = problem.training
    micro = training.global_batch // training.micro_batch
    rings_of = lru_cache(maxsize=None)(lambda devices: best_ring(problem, devices))
    machine_of = problem.cluster.machine_of_device
    best = BestPerMachineSet()
    for used in range(1, problem.cluster.num_devices + 1):
        for subset in itertools.combinations(range(problem.cluster.num_devices), used):
            machines = tuple(sorted({int(machine_of[d]) for d in subset}))
            for replicas in set_partitions(subset):
                found = [rings_of(r) for r in replicas] if len(replicas) <= micro else [None]
                if any(f is None for f in found):
                    continue
                _, m = best_batches(micro, [f[0] for f in found])
                batches, rings = [x * training.micro_batch for x in m], [f[1] for f in found]
                t, fits = plan_time(problem, batches, rings)
                if fits:
                    best.offer(machines, t, (batches, rings))
    return best.points(problem, lambda item: plan_of(problem, *item))


def frontier(problem: Problem) -> list[BrutePoint]:
    """The time–rent Pareto frontier by exhaustion, within the problem's budget (tiny priced
    problems only); each point's `plan` is a SeqPlan."""
    if (why := _too_big(problem)) is not None:
        raise ValueError(why)
    return brute_frontier(problem, best_per_machine_set(problem))


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The optimum of the problem's objective by exhaustion (tiny problems only): least T, least
    T within the budget, or least cost per token."""
    start = time.perf_counter()
    if (why := _too_big(problem)) is not None:
        return SolveResult(solver="brute", status=SolveStatus.unknown, wall_s=0.0, message=why)
    return brute_result(problem, best_per_machine_set(problem), start,
                        memory_proof(problem) or "no plan fits in memory (every plan enumerated)")


solve.honours_objective = True  # solvers.objective leaves it as it is
