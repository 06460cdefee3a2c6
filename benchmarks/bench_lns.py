"""Is there a layered plan better than the default heuristic's? (issue 33)

A search the heuristic does not do, around its plan, every candidate priced by the evaluator
(`planner.layered.pricing.breakdown`, the objective of docs/cost-model.md §3):

- a plan is D pipelines of stages (machine, t, n); devices of one machine are interchangeable,
  so concrete ids follow (`devices_in_order`), and the micro-batches are always re-split over
  the pipelines optimally (greedy min–max on each pipeline's fill-and-drain and period);
- simulated annealing over moves on one pipeline or on every pipeline of the same stage
  pattern at once (a layer between two stages; a device into or out of a TP group; a stage
  split in two or two merged; two stages swapped; a stage moved to another pipeline; a pipeline
  dropped, its devices idle), restarted from the best plan found;
- a large-neighbourhood step: one or two pipelines' devices freed and their pipelines rebuilt
  from scratch by a randomized constructor, then annealed again.

    python benchmarks/bench_lns.py [problem ...] [--seconds 300] [--save DIR]

(a problem: a bundled one by name, or bench_bounds' generated gen-G-sS-llama2-13b)

Prints a table: problem, heuristic T, best T found, gain, time, and what changed.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.io import load_problem  # noqa: E402
from planner.layered.plan import Plan, devices_in_order  # noqa: E402
from planner.layered.pricing import breakdown  # noqa: E402
from planner.layered.rules import structural_violations  # noqa: E402
from planner.layered.table import stage_table  # noqa: E402

PROBLEMS = ["hetero1-llama2-7b", "hetero1-llama2-13b", "hetero2-llama2-7b", "hetero2-llama2-13b",
            "hetero3-llama-30b"]


# -- the plan as (machine, t, n) stages ---------------------------------------------------


class Space:
    """The problem and its machines: pricing of stage lists, the free devices of a layout."""

    def __init__(self, problem):
        self.problem = problem
        cluster = problem.cluster
        self.counts = [m.count for m in cluster.machines]
        self.first = list(np.cumsum([0] + self.counts[:-1]))
        self.machine_of = {}
        for i, (f, c) in enumerate(zip(self.first, self.counts)):
            for d in range(f, f + c):
                self.machine_of[d] = i
        self.layers = problem.model.layers
        self.micro = problem.training.global_batch // problem.training.micro_batch
        self.priced = 0
        self.check = False
        model = problem.model  # rule 2 of planner/layered/rules.py: t a power of two dividing a and k
        self.widths = {t for t in (1, 2, 4, 8, 16, 32, 64) if model.heads % t == 0 and model.kv_heads % t == 0}

    def free(self, pipes):
        used = [0] * len(self.counts)
        for pipe in pipes:
            for m, t, _ in pipe:
                used[m] += t
        return [c - u for c, u in zip(self.counts, used)]

    def plan(self, pipes, micro):
        shapes = [[(m, t) for m, t, _ in pipe] for pipe in pipes]
        devices = devices_in_order(self.first, shapes)
        b = self.problem.training.micro_batch
        return Plan.from_stages(problem=self.problem.name, batches=[k * b for k in micro],
                                stages=[[(d, s[2]) for d, s in zip(dev, pipe)] for dev, pipe in zip(devices, pipes)])

    def price(self, pipes):
        """(T, micro-batches per pipeline) or (inf, None) if the layout is invalid or out of memory."""
        if not valid_layout(self, pipes):
            return math.inf, None
        d = len(pipes)
        if d > self.micro:
            return math.inf, None
        micro = split_micro(self.micro, [1.0] * d, [1.0] * d)
        b = breakdown(self.problem, stage_table(self.problem, self.plan(pipes, micro)))
        starts = np.cumsum([0] + [len(p) for p in pipes])
        steady = [float(np.maximum(b.tau, b.pp)[lo:hi].max()) for lo, hi in zip(starts[:-1], starts[1:])]
        micro = split_micro(self.micro, b.bubble.tolist(), steady)
        b = breakdown(self.problem, stage_table(self.problem, self.plan(pipes, micro)))
        self.priced += 1
        if np.any(b.memory > b.capacity):
            return math.inf, None
        if self.check and structural_violations(self.problem, self.plan(pipes, micro)):
            raise AssertionError(f"the evaluator refuses {describe(pipes)}")
        return b.iteration, micro


def valid_layout(space, pipes):
    if not pipes or any(f < 0 for f in space.free(pipes)):
        return False
    return all(sum(s[2] for s in p) == space.layers and all(s[1] in space.widths and s[2] >= 1 for s in p)
               for p in pipes)


def split_micro(total, bubble, steady):
    """The split of `total` micro-batches (≥ 1 each) minimizing max_p bubble_p + (m_p − 1)·steady_p."""
    micro = [1] * len(bubble)
    heap = [(bubble[p] + steady[p], p) for p in range(len(bubble))]
    heapq.heapify(heap)
    for _ in range(total - len(bubble)):
        _, p = heapq.heappop(heap)
        micro[p] += 1
        heapq.heappush(heap, (bubble[p] + micro[p] * steady[p], p))
    return micro


def from_plan(space, plan):
    return [[[space.machine_of[s.devices[0]], s.tp, s.layers] for s in p.stages] for p in plan.pipelines]


def describe(pipes):
    """One line per pipeline: machine:t×n stages."""
    return [" ".join(f"{m}:{t}x{n}" for m, t, n in p) for p in pipes]


# -- moves --------------------------------------------------------------------------------


def signature(pipe):
    return tuple((m, t) for m, t, _ in pipe)


def alike(pipes, p, together):
    """The pipelines a move on pipeline p changes: p alone, or every pipeline of p's stage pattern."""
    if not together:
        return [p]
    sig = signature(pipes[p])
    return [q for q in range(len(pipes)) if signature(pipes[q]) == sig]


def move_layer(space, pipes, rng, together):
    p = rng.randrange(len(pipes))
    pipe = pipes[p]
    if len(pipe) < 2:
        return None
    i = rng.randrange(len(pipe))
    j = i + rng.choice((-1, 1)) if rng.random() < 0.6 else rng.randrange(len(pipe))
    if j == i or not 0 <= j < len(pipe):
        return None
    k = rng.choice((1, 1, 1, 2))
    for q in alike(pipes, p, together):
        if pipes[q][i][2] <= k:
            return None
        pipes[q][i][2] -= k
        pipes[q][j][2] += k
    return pipes


def move_boundary(space, pipes, rng, together):
    """The stage boundary after layer b − 1 moved by one layer in every pipeline that has one
    there: layers stay aligned across pipelines (the same machines hold them)."""
    b = rng.randrange(1, space.layers)
    step = rng.choice((-1, 1))
    moved = False
    for pipe in pipes:
        ends = np.cumsum([s[2] for s in pipe])
        hits = np.flatnonzero(ends == b)
        if len(hits):
            i = int(hits[0])
            give, take = (pipe[i], pipe[i + 1]) if step < 0 else (pipe[i + 1], pipe[i])
            if give[2] < 2:
                return None
            give[2] -= 1
            take[2] += 1
            moved = True
    return pipes if moved else None


def move_width(space, pipes, rng, together):
    """A stage's TP group doubled or halved (from / to the machine's idle devices)."""
    p = rng.randrange(len(pipes))
    i = rng.randrange(len(pipes[p]))
    wider = rng.random() < 0.5
    for q in alike(pipes, p, together):
        pipes[q][i][1] = pipes[q][i][1] * 2 if wider else pipes[q][i][1] // 2
    return pipes if pipes[p][i][1] >= 1 else None


def move_split(space, pipes, rng, together):
    """A stage cut in two on its machine: its devices shared, or idle devices for the new one."""
    p = rng.randrange(len(pipes))
    i = rng.randrange(len(pipes[p]))
    m, t, n = pipes[p][i]
    if n < 2:
        return None
    t1 = t // 2 if t >= 2 and rng.random() < 0.7 else t
    t2 = t - t1 if t1 < t else rng.choice((1, 1, 2, 4))
    n1 = rng.randrange(1, n)
    after = rng.random() < 0.5
    for q in alike(pipes, p, together):
        parts = [[m, t1, n1], [m, t2, n - n1]]
        pipes[q][i: i + 1] = parts if after else parts[::-1]
    return pipes


def move_merge(space, pipes, rng, together):
    p = rng.randrange(len(pipes))
    pipe = pipes[p]
    if len(pipe) < 2:
        return None
    i = rng.randrange(len(pipe) - 1)
    if pipe[i][0] != pipe[i + 1][0]:
        return None
    keep = rng.random() < 0.5  # keep both groups' devices, or only the wider group
    for q in alike(pipes, p, together):
        a, b = pipes[q][i], pipes[q][i + 1]
        pipes[q][i: i + 2] = [[a[0], a[1] + b[1] if keep else max(a[1], b[1]), a[2] + b[2]]]
    return pipes


def move_swap(space, pipes, rng, together):
    """Two stages of a pipeline change places (their layer counts stay in place)."""
    p = rng.randrange(len(pipes))
    pipe = pipes[p]
    if len(pipe) < 2:
        return None
    i = rng.randrange(len(pipe) - 1)
    j = i + 1 if rng.random() < 0.6 else rng.randrange(len(pipe))
    for q in alike(pipes, p, together):
        a, b = pipes[q][i], pipes[q][j]
        a[0], a[1], b[0], b[1] = b[0], b[1], a[0], a[1]
    return pipes


def move_exchange(space, pipes, rng, together):
    """Stages of two pipelines exchange their devices (machine and width); layers stay."""
    if len(pipes) < 2:
        return None
    p, q = rng.sample(range(len(pipes)), 2)
    i, j = rng.randrange(len(pipes[p])), rng.randrange(len(pipes[q]))
    a, b = pipes[p][i], pipes[q][j]
    a[0], a[1], b[0], b[1] = b[0], b[1], a[0], a[1]
    return pipes


def move_transfer(space, pipes, rng, together):
    """A stage moves to another pipeline; both pipelines' layer counts are evened out again."""
    if len(pipes) < 2:
        return None
    p, q = rng.sample(range(len(pipes)), 2)
    if len(pipes[p]) < 2:
        return None
    stage = pipes[p].pop(rng.randrange(len(pipes[p])))
    pipes[q].insert(rng.randrange(len(pipes[q]) + 1), stage)
    for r in (p, q):
        refill(space, pipes[r], rng)
    return pipes


def move_drop(space, pipes, rng, together):
    """A pipeline removed (its devices idle, to be taken by the other moves)."""
    if len(pipes) < 2:
        return None
    pipes.pop(rng.randrange(len(pipes)))
    return pipes


def refill(space, pipe, rng):
    """Layer counts of a pipeline brought back to L: from the stages of most layers per device,
    to the stages of fewest."""
    total = sum(s[2] for s in pipe)
    while total > space.layers:
        s = max((s for s in pipe if s[2] > 1), key=lambda s: (s[2] / s[1], rng.random()))
        s[2] -= 1
        total -= 1
    while total < space.layers:
        s = min(pipe, key=lambda s: (s[2] / s[1], rng.random()))
        s[2] += 1
        total += 1


MOVES = [(move_layer, 4), (move_boundary, 4), (move_width, 2), (move_split, 2), (move_merge, 2), (move_swap, 1),
         (move_exchange, 1), (move_transfer, 1), (move_drop, 0.2)]


# -- construction of freed pipelines ------------------------------------------------------


def layer_time(space, m, t):
    """τ of one layer on a stage of t devices of machine m (the evaluator's own terms)."""
    from planner.layered import cost
    from planner.layered.cost import StageShape
    shape = StageShape.on(space.problem.cluster, m, t, 1)
    return float(cost.stage_time(space.problem.model, space.problem.training, shape))


def tp_groups(count, rng):
    """A random cut of `count` devices of one machine into TP groups."""
    style = rng.randrange(4)
    if style == 0:
        return [1] * count
    if style == 1 and count & (count - 1) == 0:
        return [count]
    if style == 2:
        return [2] * (count // 2) + [1] * (count % 2)
    groups, left = [], count
    while left:
        g = rng.choice([w for w in (1, 2, 4, 8) if w <= left])
        groups.append(g)
        left -= g
    return groups


def build_pipeline(space, per_machine, order, rng):
    """A pipeline over `per_machine` devices (machine → count), machine blocks in `order`,
    layers shared in proportion to each stage's speed."""
    stages = []
    for m in order:
        if per_machine.get(m, 0):
            groups = tp_groups(per_machine[m], rng)
            rng.shuffle(groups)
            stages += [[m, t, 1] for t in groups]
    if not stages or len(stages) > space.layers:
        return None
    speed = np.array([1.0 / layer_time(space, m, t) for m, t, _ in stages])
    share = np.maximum(1, np.floor(speed / speed.sum() * space.layers)).astype(int)
    for s, n in zip(stages, share):
        s[2] = int(n)
    refill(space, stages, rng)
    return stages


def rebuild(space, pipes, rng, free_count=None):
    """Large-neighbourhood step: one or two pipelines removed and k new ones dealt from their
    devices and every idle device (each machine's devices dealt at random to the k)."""
    pipes = [[list(s) for s in p] for p in pipes]
    drop = rng.sample(range(len(pipes)), min(len(pipes), free_count or rng.choice((1, 1, 2))))
    kept = [p for i, p in enumerate(pipes) if i not in drop]
    pool = space.free(kept)
    k = max(1, len(drop) + rng.choice((-1, 0, 0, 0, 1)))
    order = [m for m, _, _ in (kept[0] if kept else [])]
    order = list(dict.fromkeys(order + [m for m in range(len(pool)) if m not in order]))
    if rng.random() < 0.3:
        rng.shuffle(order)
    deal = [dict() for _ in range(k)]
    for m, c in enumerate(pool):
        even = rng.random() < 0.5
        for d in range(c):
            j = d % k if even else rng.randrange(k)
            deal[j][m] = deal[j].get(m, 0) + 1
    new = [build_pipeline(space, per, order, rng) for per in deal]
    return kept + [p for p in new if p]


# -- the search ---------------------------------------------------------------------------


def copy(pipes):
    return [[list(s) for s in p] for p in pipes]


def neighbour(space, pipes, rng):
    moves, weights = zip(*MOVES)
    move = rng.choices(moves, weights)[0]
    return move(space, copy(pipes), rng, rng.random() < 0.5)


def anneal(space, pipes, seconds, rng, temp=(0.05, 0.0005)):
    """Simulated annealing from `pipes`; returns the best (T, pipes, micro) met."""
    cur = copy(pipes)
    cur_t, micro = space.price(cur)
    best = (cur_t, copy(cur), micro)
    start = time.time()
    while (elapsed := time.time() - start) < seconds:
        heat = temp[0] * (temp[1] / temp[0]) ** (elapsed / seconds)
        new = neighbour(space, cur, rng)
        if new is None:
            continue
        t, micro = space.price(new)
        if t <= cur_t or rng.random() < math.exp(-(t - cur_t) / heat):
            cur, cur_t = new, t
            if t < best[0] - 1e-9:
                best = (t, copy(new), micro)
    return best


def lns(space, pipes, seconds, rng, log=print):
    """Anneal; then, until the time is out, rebuild one or two pipelines of the best plan and
    anneal from there, keeping what improves."""
    start = time.time()
    best = anneal(space, pipes, min(60.0, seconds / 4), rng)
    log(f"  anneal from the start: {best[0]:.4f} s")
    while time.time() - start < seconds:
        trial = rebuild(space, best[1], rng)
        got = anneal(space, trial, min(20.0, seconds - (time.time() - start)), rng, temp=(0.02, 0.0005))
        if got[0] < best[0] - 1e-9:
            log(f"  {time.time() - start:6.0f} s: {got[0]:.4f} s  D={len(got[1])}")
            best = got
    return best


# -- the aligned family, enumerated -------------------------------------------------------
# Every layer's D holders on one machine (a layer synced across machines costs 0.1–0.5 s over
# 10 GbE), so each used machine holds one block of λ_M layers in every pipeline; n_A alike
# pipelines of c_A[M] devices per machine and n_B alike ones of the rest. For a steady period
# s per kind, a machine's cell (its devices in one pipeline, λ_M layers) is best cut into the
# TP groups and layer counts of least Σ τ with every τ ≤ s; the fluid T' of the two kinds,
# (M − D + n_A·B_A/s_A + n_B·B_B/s_B) / (n_A/s_A + n_B/s_B), is then separable by machine,
# a DP over Σ λ_M = L for every pair (s_A, s_B). The best pairs' plans are priced exactly.


class Cells:
    """Per machine (by its figures): least Σ τ of a cell for every s of a grid."""

    def __init__(self, space, grid):
        from planner.layered import cost
        from planner.layered.cost import StageShape
        self.space, self.grid, self.cost, self.Shape = space, grid, cost, StageShape
        p = space.problem
        self.key = [(m.gpu, m.intra_bw_gbps) for m in p.cluster.machines]
        self.cache = {}
        self.groups = {c: widths_upto(c, sorted(space.widths)) for c in range(max(space.counts) + 1)}

    def stage(self, m, t, n, last, first=0, q=1, d=1):
        shape = self.Shape.on(self.space.problem.cluster, m, t, n, first=first, last=last, in_flight=q, pipelines=d)
        return shape

    def coeffs(self, m, t, first, last, q, d):
        p = self.space.problem
        a = float(self.cost.stage_time(p.model, p.training, self.stage(m, t, 1, 0)))
        h = float(self.cost.stage_time(p.model, p.training, self.stage(m, t, 0, 1))) if last else 0.0
        cap = p.cluster.machine_memory_bytes[m]
        nmem = int(self.cost.max_layers_fitting(p.model, p.training, self.stage(m, t, 1, last, first, q, d), cap))
        return a, h, nmem

    def pp(self, m, t_next, cross):
        p = self.space.problem
        c = p.cluster
        bw, lat = (p.training and (float(c.inter_bw_gbps), c.inter_latency_us * 1e-6)) if cross else (
            float(c.machine_intra_bw[m]), float(c.machine_intra_lat[m]))
        return float(self.cost.stage_pp_time(p.model, p.training, link_bw_gbps=bw, link_lat_s=lat, t_next=t_next,
                                             bw_next_gbps=c.machine_intra_bw[m], lat_next_s=c.machine_intra_lat[m]))

    def table(self, m, c, lam, first, last, after, d):
        """(least Σ τ + intra-cell T_pp over the grid, index of the stage list that gives it, stage lists)."""
        key = (self.key[m], c, lam, first, last, after, d)
        if key not in self.cache:
            self.cache[key] = self._table(m, c, lam, first, last, after, d)
        return self.cache[key]

    def _table(self, m, c, lam, first, last, after, d):
        best = np.full(len(self.grid), np.inf)
        pick = np.full(len(self.grid), -1)
        shapes = []
        for widths in self.groups[c]:
            if len(widths) > lam:
                continue
            for head in (sorted(set(widths)) if last else [None]):
                order = list(widths)
                if head is not None:
                    order.remove(head)
                    order.append(head)
                cost, counts = self._fill(m, order, lam, first, last, after, d)
                better = cost < best
                best[better] = cost[better]
                pick[better] = len(shapes)
                shapes.append((order, counts))
        return best, pick, shapes

    def _fill(self, m, order, lam, first, last, after, d):
        """Least Σ τ of stages `order` (widths) on machine m holding lam layers, every τ ≤ s."""
        k = len(order)
        coeffs = [self.coeffs(m, t, int(first and i == 0), int(last and i == k - 1), k - i + after, d)
                  for i, t in enumerate(order)]
        a = np.array([x[0] for x in coeffs])
        h = np.array([x[1] for x in coeffs])
        nmem = np.array([x[2] for x in coeffs])
        nmax = np.minimum(nmem[:, None], np.floor((self.grid[None, :] - h[:, None]) / a[:, None] + 1e-9))
        ok = (nmax.min(axis=0) >= 1) & (nmax.sum(axis=0) >= lam)
        counts = np.ones((k, len(self.grid)))
        left = np.full(len(self.grid), float(lam - k))
        for i in np.argsort(a, kind="stable"):
            take = np.clip(np.minimum(nmax[i] - 1, left), 0, None)
            counts[i] += take
            left -= take
        cost = (counts * a[:, None]).sum(axis=0) + h.sum()
        cost += sum(self.pp(m, order[i + 1], False) for i in range(k - 1))
        return np.where(ok, cost, np.inf), counts


def widths_upto(c, widths):
    """Every multiset of TP widths (non-increasing) of at most c devices in all."""
    out = []

    def grow(prefix, left, top):
        if prefix:
            out.append(tuple(prefix))
        for w in widths:
            if w <= min(left, top):
                grow(prefix + [w], left - w, w)
    grow([], c, c)
    return out


def orders(space, limit=None):
    """Machine sequences up to like machines: (first, middle..., last) over subsets of machines,
    one per (first's kind, last's kind, middle kinds as a multiset)."""
    import itertools
    kind = [(m.gpu, m.count, m.intra_bw_gbps) for m in space.problem.cluster.machines]
    seen, out = set(), []
    n = len(kind)
    for k in range(n, 0, -1):  # every machine first: the deadline cuts the small subsets
        for seq in itertools.permutations(range(n), k):
            sig = (kind[seq[0]], kind[seq[-1]], tuple(sorted(kind[m] for m in seq[1:-1])), k)
            if sig not in seen:
                seen.add(sig)
                out.append(seq)
    return out


def machine_values(cells, order, j, kinds, grid_a, grid_b):
    """For machine order[j]: per λ the least n_A·cell_A/s_A + n_B·cell_B/s_B over c_A (pairs of s)."""
    n_a, n_b = kinds
    m, space = order[j], cells.space
    d, last, after = n_a + n_b, int(j == len(order) - 1), len(order) - 1 - j
    cross = 0.0 if last else cells.pp(order[j + 1], 1, True)
    L = space.layers
    values = np.full((L + 1, len(grid_a), len(grid_b)), np.inf)
    choice = np.zeros((L + 1, len(grid_a), len(grid_b)), dtype=int)
    for c_a in range(1, space.counts[m] // n_a + 1):
        c_b = (space.counts[m] - n_a * c_a) // n_b if n_b else 0
        if n_b and c_b < 1:
            continue
        for lam in range(1, L + 1):
            a = cells.table(m, c_a, lam, int(j == 0), last, after, d)[0]
            v = n_a * (a + cross) / cells.grid
            v = v[:, None] if not n_b else v[:, None] + n_b * (cells.table(m, c_b, lam, int(j == 0), last, after, d)[0]
                                                               + cross)[None, :] / cells.grid[None, :]
            better = v < values[lam]
            values[lam][better] = v[better]
            choice[lam][better] = c_a
    return values, choice


def aligned_dp(cells, order, kinds):
    """min over λ (Σ = L) and c_A of Σ_M machine values, for every (s_A, s_B); with the choices."""
    L = cells.space.layers
    nb = len(cells.grid) if kinds[1] else 1
    best = np.full((L + 1, len(cells.grid), nb), np.inf)
    best[0] = 0.0
    trail = []
    for j in range(len(order)):
        values, choice = machine_values(cells, order, j, kinds, cells.grid, cells.grid[:nb])
        new = np.full_like(best, np.inf)
        lam_of = np.zeros(best.shape, dtype=int)
        for total in range(1, L + 1):
            for lam in range(1, total + 1):
                v = best[total - lam] + values[lam]
                better = v < new[total]
                new[total][better] = v[better]
                lam_of[total][better] = lam
        trail.append((lam_of, choice))
        best = new
    return best[L], trail


def aligned_plans(cells, order, kinds, top=8):
    """The plans of the `top` pairs (s_A, s_B) of least fluid T' for this order and kinds."""
    space, grid = cells.space, cells.grid
    n_a, n_b = kinds
    x, trail = aligned_dp(cells, order, kinds)
    sb = grid[None, :] if n_b else np.ones((1, 1))
    rate = n_a / grid[:, None] + (n_b / sb if n_b else 0.0)
    fluid = (space.micro - n_a - n_b + x) / rate
    plans = []
    for flat in np.argsort(fluid, axis=None)[:top]:
        ia, ib = np.unravel_index(flat, fluid.shape)
        if not np.isfinite(fluid[ia, ib]):
            break
        plans.append((float(fluid[ia, ib]), rebuild_aligned(cells, order, kinds, trail, ia, ib)))
    return plans


def rebuild_aligned(cells, order, kinds, trail, ia, ib):
    """The stage lists of the DP's choice at (s_A, s_B): n_A copies of pipeline A, n_B of B."""
    n_a, n_b = kinds
    space, total = cells.space, cells.space.layers
    cells_a, cells_b = [], []
    for j in range(len(order) - 1, -1, -1):
        lam_of, choice = trail[j]
        lam = int(lam_of[total, ia, ib])
        c_a = int(choice[lam, ia, ib])
        m, last, after, d = order[j], int(j == len(order) - 1), len(order) - 1 - j, n_a + n_b
        cells_a.append(cell_stages(cells, m, c_a, lam, j == 0, last, after, d, ia))
        if n_b:
            c_b = (space.counts[m] - n_a * c_a) // n_b
            cells_b.append(cell_stages(cells, m, c_b, lam, j == 0, last, after, d, ib))
        total -= lam
    pipe_a = [s for cell in reversed(cells_a) for s in cell]
    pipe_b = [s for cell in reversed(cells_b) for s in cell]
    return [copy([pipe_a])[0] for _ in range(n_a)] + [copy([pipe_b])[0] for _ in range(n_b)]


def cell_stages(cells, m, c, lam, first, last, after, d, i):
    _, pick, shapes = cells.table(m, c, lam, int(first), last, after, d)
    order, counts = shapes[pick[i]]
    return [[m, t, int(n)] for t, n in zip(order, counts[:, i])]


def enumerate_aligned(space, kinds_list, t_ref, ratio=1.02, top=6, deadline=math.inf):
    """Every order and kinds: the DP's best plans priced exactly; returns [(T, pipes, micro, what)]."""
    lo_hi = steady_range(space, t_ref)
    grid = np.exp(np.arange(math.log(lo_hi[0]), math.log(lo_hi[1]), math.log(ratio)))
    cells = Cells(space, grid)
    found = []
    for order in orders(space):
        for kinds in kinds_list:
            if time.time() > deadline:
                return sorted(found, key=lambda f: f[0])
            if min(space.counts[m] for m in order) < sum(kinds):
                continue
            for fluid, pipes in aligned_plans(cells, order, kinds, top):
                t, micro = space.price(pipes)
                if math.isfinite(t):
                    found.append((t, pipes, micro, f"aligned {kinds} order {order} fluid {fluid:.3f}"))
    return sorted(found, key=lambda f: f[0])


def steady_range(space, t_ref):
    """Periods worth trying, for a plan near t_ref: from 0.8·t_ref/M (every micro-batch in one
    period) to t_ref/8 (a pipeline of fewer than 8 micro-batches is all fill and drain)."""
    return 0.8 * t_ref / space.micro, t_ref / 8


# -- the bench ----------------------------------------------------------------------------


KINDS = [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (1, 1), (2, 1), (3, 1), (1, 2), (4, 1), (2, 2)]


def heuristic_plan(problem, path, seconds):
    """The default heuristic's plan (`hexiscale solve --kind layered` at its 60 s), read back if saved."""
    if path.exists():
        return Plan.model_validate_json(path.read_text())
    from solvers.common import SolverOptions
    from solvers.layered.composed import solve_heuristic
    plan = solve_heuristic(problem, SolverOptions(time_limit_s=seconds)).plan
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.to_json())
    return plan


def named_problem(name):
    """A bundled problem by name, or one of bench_bounds' generated ones (gen-G-sS-llama2-13b)."""
    generated = re.fullmatch(r"gen-(\d+)-s(\d+)-llama2-13b", name)
    if generated:
        from bench_bounds import generated as generated_problem
        return generated_problem(int(generated[1]), int(generated[2]))
    return load_problem(ROOT / "instances" / "problems" / f"{name}.yaml")


def search(name, seconds, save, heuristic_seconds, seed=0, log=print):
    """Heuristic plan, the aligned enumeration, then annealing and rebuilds from the best plans."""
    problem = named_problem(name)
    space = Space(problem)
    start_plan = heuristic_plan(problem, save / f"{name}.heuristic.json", heuristic_seconds)
    start = from_plan(space, start_plan)
    t_heur, _ = space.price(start)
    began = time.time()
    found = enumerate_aligned(space, KINDS, t_heur, deadline=began + seconds / 2)
    log(f"{name}: heuristic {t_heur:.4f} s; aligned enumeration {time.time() - began:.0f} s, "
        f"best {found[0][0] if found else math.inf:.4f} s ({found[0][3] if found else '-'})")
    starts = [(t_heur, start, None, "heuristic")] + distinct(found, 3)
    rng = random.Random(seed)
    best = min(starts, key=lambda s: s[0])
    share = max(0.0, began + seconds - time.time()) / len(starts)
    for t0, pipes, _, what in starts:
        got = lns(space, pipes, share, rng, log=lambda s: log(f"  from {what[:40]}: {s}"))
        if got[0] < best[0] - 1e-9:
            best = (got[0], got[1], got[2], f"{what} + annealing")
    return problem, space, t_heur, best, time.time() - began


def distinct(found, k):
    out, seen = [], set()
    for f in found:
        key = str(sorted(map(str, f[1])))
        if key not in seen:
            seen.add(key)
            out.append(f)
        if len(out) == k:
            break
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=PROBLEMS)
    parser.add_argument("--seconds", type=float, default=300.0, help="search time per problem")
    parser.add_argument("--heuristic-seconds", type=float, default=60.0)
    parser.add_argument("--save", type=Path, default=ROOT / "benchmarks" / "report" / "lns_plans")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for name in args.problems:
        problem, space, t_heur, best, wall = search(name, args.seconds, args.save, args.heuristic_seconds, args.seed)
        gain = (t_heur - best[0]) / t_heur * 100
        if gain > 1e-6:
            plan = space.plan(best[1], best[2])
            (args.save / f"{name}.lns.json").write_text(plan.to_json())
        rows.append((name, t_heur, best[0], gain, wall, best[3] if gain > 1e-6 else "nothing better",
                     describe(best[1])))
    print("\n| problem | heuristic T s | best T s | gain % | search s | found by |\n|---|---:|---:|---:|---:|---|")
    for name, th, tb, gain, wall, what, _ in rows:
        print(f"| {name} | {th:.4f} | {tb:.4f} | {gain:.3f} | {wall:.0f} | {what} |")
    for name, *_, pipes in rows:
        print(f"\n{name}, best plan (machine:t x layers per stage):")
        for line in pipes:
            print("  " + line)


if __name__ == "__main__":
    main()
