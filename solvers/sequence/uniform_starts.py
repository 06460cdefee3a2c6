"""The `seq-uniform` layouts as starts of the sequence heuristic (docs/sequence-plans.md §7).

The heuristic polishes the best uniform layout, so it is never slower than `seq-uniform`
(`solvers.sequence.baselines`) and beats it wherever an uneven shard, head split or batch
split helps. The layouts are the baseline's own (its device orders, HP degrees n dividing k,
groups packed or inside one machine, every G whose shards split into token blocks, D dividing
B/b), priced faster: replica r of a layout with G groups per ring is the r-th run of G blocks
whatever D is, so each run is priced once (`ring_overflow`, many rings per call) and a
layout's T is its first D runs' max m_r·T_mb (batches split by `split_batches`, never worse
than the baseline's equal split) plus T_dp, computed only for layouts that can still win.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from planner.problem import Problem
from solvers.sequence.baselines import Block, device_orders, machine_blocks, packed_blocks, splits_tokens
from solvers.sequence.space import Ring, dp_time, mixes_vendors, ring_overflow, split_batches, vendor_of_devices

UNIFORM = "uniform"  # the deal named in a uniform start's label
BATCH_MEMBERS = 20000  # members priced per call


@dataclass(frozen=True)
class Runs:
    """The uniform rings of consecutive runs of G blocks of one device order, with their
    T_mb and memory overflow (≤ 0: fits)."""

    degree: int
    groups: int
    rings: list[Ring]
    tmb: list[float]
    over: list[float]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def uniform_ring(problem: Problem, blocks: list[Block]) -> Ring | None:
    """One replica of G equal groups: a/n heads and s/(G·n) tokens per member; None when a
    group mixes vendors (§8: the all-to-all has no cross-vendor route)."""
    vendors = vendor_of_devices(problem)
    if any(mixes_vendors([vendors[d] for d in block]) for block in blocks):
        return None
    degree = len(blocks[0])
    heads, tokens = problem.model.heads // degree, problem.training.seq_len // (len(blocks) * degree)
    return [[(d, heads, tokens) for d in block] for block in blocks]


def run_rings(problem: Problem, blocks: list[Block], groups: int, most: int) -> list[Ring]:
    """The first (at most `most`) runs of G blocks as rings, up to the first that mixes vendors."""
    rings = []
    for r in range(min(most, len(blocks) // groups)):
        ring = uniform_ring(problem, blocks[r * groups:(r + 1) * groups])
        if ring is None:
            break
        rings.append(ring)
    return rings


def block_runs(problem: Problem) -> Iterator[tuple[int, int, list[Ring]]]:
    """(n, G, rings) of every distinct run of blocks the baseline's layouts use (B/b runs at most)."""
    micro = problem.training.global_batch // problem.training.micro_batch
    seen: set[tuple] = set()
    for order in device_orders(problem):
        for degree in divisors(problem.model.num_kv_heads):
            for blocks in (packed_blocks(order, degree), machine_blocks(problem, order, degree)):
                for groups in range(len(blocks), 0, -1):
                    if not splits_tokens(problem, groups, degree):
                        continue
                    used = min(micro, len(blocks) // groups) * groups
                    key = (groups, tuple(blocks[:used]))
                    if key not in seen:
                        seen.add(key)
                        yield degree, groups, run_rings(problem, blocks, groups, micro)


def priced_runs(problem: Problem, deadline: float) -> list[Runs]:
    """Every run of `block_runs` priced, BATCH_MEMBERS members per call (while time lasts:
    at least one batch)."""
    out: list[Runs] = []
    pending: list[tuple[int, int, list[Ring]]] = []
    members = 0
    for degree, groups, rings in block_runs(problem):
        if out and time.perf_counter() > deadline:
            return out
        if rings:
            pending.append((degree, groups, rings))
            members += len(rings) * groups * degree
        if members >= BATCH_MEMBERS:
            out += _price(problem, pending)
            pending, members = [], 0
    return out + _price(problem, pending)


def _price(problem: Problem, pending: list[tuple[int, int, list[Ring]]]) -> list[Runs]:
    """The runs of `pending` priced in one call."""
    if not pending:
        return []
    tmb, over = ring_overflow(problem, [ring for _, _, rings in pending for ring in rings])
    out, at = [], 0
    for degree, groups, rings in pending:
        out.append(Runs(degree, groups, rings, tmb[at:at + len(rings)].tolist(), over[at:at + len(rings)].tolist()))
        at += len(rings)
    return out


def layouts(problem: Problem, runs: list[Runs]) -> list[tuple[float, int, Runs, int, list[int]]]:
    """(compute part max m_r·T_mb, index, runs, D, batches) of every uniform layout that fits,
    fastest first."""
    training = problem.training
    micro = training.global_batch // training.micro_batch
    out = []
    for i, run in enumerate(runs):
        for d in (d for d in divisors(micro) if d <= len(run.rings)):
            if max(run.over[:d]) > 0:
                continue
            m = split_batches(micro, run.tmb[:d])
            out.append((max(x * t for x, t in zip(m, run.tmb)), i, run, d, [x * training.micro_batch for x in m]))
    return sorted(out, key=lambda x: x[:2])


def best_uniform(problem: Problem, deadline: float, keep: int = 1) -> list[tuple]:
    """The `keep` fastest uniform layouts that fit, as heuristic candidates ((0, T), batches,
    rings, (−1, n, D, "uniform")), fastest first: T_dp is added only while the compute part
    alone can still beat the keep-th best."""
    best: list[tuple] = []
    for compute, _, run, d, batches in layouts(problem, priced_runs(problem, deadline)):
        if len(best) >= keep and compute >= best[keep - 1][0][1]:
            break
        rings = run.rings[:d]
        t = compute + dp_time(problem, rings)
        best = sorted(best + [((0.0, t), batches, rings, (-1, run.degree, d, UNIFORM))], key=lambda c: c[0])[:keep]
    return best
