"""Combinatorial lower bounds per number of pipelines D, and the structures that can still
beat an incumbent (docs/formulation.md §4, [B1]–[B5]).

A pipeline's *allocation* is how many devices of each machine its stages use. For every
allocation a and micro-batch count m, `pipe_floor[m, a]` is a lower bound on T_pipe of any
pipeline that uses at most a devices and runs m micro-batches. The bound of D is the
smallest max_p pipe_floor[m_p, a_p] over every way to give D pipelines allocations that fit
the machines and micro-batches that sum to B/b, plus T_dp's floor. It is computed by a
reachability sweep over (devices used, micro-batches used), so no model is built: a D whose
bound reaches the incumbent is proved not to beat it without a model. For the other D,
`structures` lists the (stage-type multiset, m_p) per pipeline that can still beat the
incumbent, and `ordered_structures` their stage orders; the models then solve each with
the structure fixed.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.layered import cost
from solvers.layered.tables import Tables


MAX_SHAPES = 20_000  # beyond this (larger clusters) the bounds are skipped: the models alone run
SECONDS_PER_SHAPE = 1e-3  # measured: small-16's 10⁴ shapes tabulate in about 10 s on a shared core
# `fits` sweeps (B/b + 1)² × allocations booleans, twice: beyond this many the bounds are skipped
# (B/b = 65,536 on two 1-GPU machines asked for 17 GB, and 10⁶ for 3.6 TiB, before any deadline)
MAX_REACH_CELLS = 1e8


@dataclass(frozen=True)
class Shape:
    """A multiset of stage types (indices into Tables.types) with its device use per machine."""

    stages: tuple[int, ...]
    usage: tuple[int, ...]


class PipelineFloors:
    """pipe_floor[m, a] for every micro-batch count m and allocation a (mixed radix index)."""

    def __init__(self, tables: Tables, pipelines: int = 1, memory_pipelines: int | None = None):
        """Floors with the last stage's sync of D = `pipelines` (none for 1) and the memory caps
        of a plan of `memory_pipelines` (default D; they differ only under ZeRO-1, §11)."""
        self.tb, self.d = tables, pipelines
        self.n_max = tables.n_max_for(pipelines if memory_pipelines is None else memory_pipelines)
        self.counts = [mach.count for mach in tables.cluster.machines]
        self.radix = [c + 1 for c in self.counts]
        self.strides = [int(np.prod(self.radix[:k])) for k in range(len(self.radix))]
        self.num_allocations = int(np.prod(self.radix))

    @cached_property
    def shape_count(self) -> float:
        return float(np.prod([len(self._machine_options(k)) for k in range(len(self.counts))], dtype=float))

    def affordable(self, seconds: float) -> bool:
        """Few enough shapes and allocations to tabulate (small clusters), and micro-batches
        to sweep (`fits`), in about half the time left (each shape costs about a millisecond,
        once per D)."""
        small = self.shape_count <= MAX_SHAPES and self.num_allocations <= MAX_SHAPES
        sweep = float(self.tb.total_micro + 1) ** 2 * self.num_allocations <= MAX_REACH_CELLS
        return small and sweep and self.shape_count * SECONDS_PER_SHAPE <= 0.5 * seconds

    def _machine_options(self, k: int) -> list[tuple[int, ...]]:
        """Every multiset of stage types on machine k that fits its devices (empty included)."""
        types = [i for i, c in enumerate(self.tb.types) if c.machine == k]
        options = [()]
        for size in range(1, self.counts[k] + 1):
            for combo in itertools.combinations_with_replacement(types, size):
                if sum(self.tb.types[i].tp for i in combo) <= self.counts[k]:
                    options.append(combo)
        return options

    def index(self, usage) -> int:
        return sum(u * s for u, s in zip(usage, self.strides))

    def shapes(self) -> list[Shape]:
        """Every non-empty multiset of stage types that fits the machines (order is free)."""
        per_machine = [self._machine_options(k) for k in range(len(self.counts))]
        out = []
        for parts in itertools.product(*per_machine):
            stages = tuple(i for part in parts for i in part)
            if stages and len(stages) <= self.tb.layers:
                usage = tuple(sum(self.tb.types[i].tp for i in part) for part in parts)
                out.append(Shape(stages, usage))
        return out

    @cached_property
    def table(self) -> np.ndarray:
        """[m, allocation index] (m = 0..B/b; row 0 unused), +inf where nothing fits. [B1]"""
        tb = self.tb
        exact = np.full((tb.total_micro + 1, self.num_allocations), np.inf)
        recv = self._receive_floor()
        self.dp_layer, self.dp_head = self._last_stage_sync()
        self.shape_floors: list[tuple[Shape, np.ndarray]] = []  # [m] per shape, before closure
        for shape in self.shapes():
            floors = self._shape_floors(shape, recv)
            if floors is not None:
                self.shape_floors.append((shape, floors))
                idx = self.index(shape.usage)
                exact[:, idx] = np.minimum(exact[:, idx], floors)
        return self._monotone(exact)

    def _monotone(self, exact: np.ndarray) -> np.ndarray:
        """More devices never hurt (devices may stay idle): floor[a] = min over a' ≤ a."""
        grid = exact.reshape((exact.shape[0], *reversed(self.radix)))
        for axis in range(1, grid.ndim):
            grid = np.minimum.accumulate(grid, axis=axis)
        return grid.reshape(exact.shape)

    def _last_stage_sync(self) -> tuple[np.ndarray, np.ndarray]:
        """[c]: floors of τ_dp(layer) and of τ_dp(head) when a stage of type c holds it (D ≥ 2):
        t_min ≤ t_c, and the holders' pair includes c's machine, so bw_min ≤ its best link and
        α_max ≥ its least latency. A tied model's "head" is its shared sync, over n ≥ D holders
        (an all-reduce grows with n). [B3]"""
        tb, d = self.tb, self.d
        if d < 2:
            zero = np.zeros(len(tb.types))
            return zero, zero
        bw, lat = tb.cluster.bw_matrix, tb.cluster.lat_matrix
        near = [(int(np.argmax(bw[c.machine])), int(np.argmin(lat[c.machine]))) for c in tb.types]
        layer = np.array([tb.dp_bw_part(d, tb.pseudo_params["layer"], c.tp, c.machine, fast)
                          + tb.dp_lat_part(d, c.machine, close) for c, (fast, close) in zip(tb.types, near)])
        if tb.tied:
            head = np.array([tb.tied_bw_part(d, c.tp, c.machine, fast) + tb.tied_lat_part(d, c.machine, close)
                             for c, (fast, close) in zip(tb.types, near)])
        else:
            head = np.array([tb.dp_bw_part(d, tb.pseudo_params["head"], c.tp, c.machine, fast)
                             + tb.dp_lat_part(d, c.machine, close) for c, (fast, close) in zip(tb.types, near)])
        return layer, head

    def _receive_floor(self) -> np.ndarray:
        """[c]: the least T_pp into a stage of type c, over every sending machine."""
        tb = self.tb
        return np.array([tb.pp_link[:, c.machine].min() + tb.pp_bcast[i] for i, c in enumerate(tb.types)])

    def _shape_floors(self, shape: Shape, recv: np.ndarray) -> np.ndarray | None:
        """[m]: the least Σ_k τ_k + Σ_k T_pp,k + (m − 1)·max_k τ_k over every order and layer
        split of the shape's stages, with the most lenient memory (q = 1, no embedding or
        head) and each receiving stage's cheapest T_pp. [B1]"""
        tb, big_l = self.tb, self.tb.layers
        idx = np.array(shape.stages)
        a, h = tb.tau_layer[idx], tb.tau_head[idx]
        caps = self.n_max[idx, 0, 0, 1]
        if caps.min() < 1 or caps.sum() < big_l:
            return None
        micro = np.maximum(np.arange(tb.total_micro + 1) - 1, 0)
        traffic = recv[idx].sum() - recv[idx].max()
        best = np.full(len(micro), np.inf)
        for j in sorted({int(np.flatnonzero(idx == c)[0]) for c in idx}):  # the stage with the head
            sync = (self.dp_layer[idx[j]], self.dp_head[idx[j]])
            best = np.minimum(best, self._split_floor(a, h, caps, j, micro, sync))
        return best + traffic

    def _split_floor(self, a, h, caps, j: int, micro: np.ndarray, sync: tuple[float, float],
                     least_r: float = 0.0) -> np.ndarray:
        """[m]: min over n (1 ≤ n_k ≤ cap_k, Σ n = L) of Σ τ + (m − 1)·R with τ_k ≤ R, stage j
        last. For a fixed R the least Σ τ fills the cheapest stages first (exact for a sum);
        the optimum R is one of the values n·a_k (+ h_j for k = j). T ≥ T_pipe + the last
        stage's sync, so stage j's layers also cost sync[0] each and the head sync[1]. [B3]"""
        big_l, s = self.tb.layers, len(a)
        shift = np.where(np.arange(s) == j, h[j], 0.0)
        cand = np.unique(np.concatenate([np.arange(1, int(c) + 1) * ak + sk for ak, c, sk in zip(a, caps, shift)]))
        upper = np.minimum(caps[None, :], np.floor((cand[:, None] - shift[None, :]) / a[None, :] + 1e-9))
        ok = (upper.min(axis=1) >= 1) & (upper.sum(axis=1) >= big_l)
        cand, upper = cand[ok], upper[ok]
        if not len(cand):
            return np.full(len(micro), np.inf)
        cost = a + np.where(np.arange(s) == j, sync[0], 0.0)
        order = np.argsort(cost)
        room = (upper - 1)[:, order]  # extra layers each stage can take, cheapest first
        before = np.cumsum(room, axis=1) - room
        extra = np.clip((big_l - s) - before, 0, room)
        sums = cost.sum() + h[j] + sync[1] + (extra * cost[order][None, :]).sum(axis=1)
        slowest = np.maximum(cand, least_r)  # max_k max(τ_k, T_pp,k) ≥ the largest T_pp
        return (sums[:, None] + slowest[:, None] * micro[None, :]).min(axis=0)


class OutOfTime(Exception):
    """A D's bound was stopped at its deadline: that D is left to the models."""


class DBounds:
    """The bound of each D from the pipeline floors. [B2]"""

    def __init__(self, tables: Tables):
        self.tb = tables
        self.plain = PipelineFloors(tables)  # D = 1 (no sync): valid for every D but under ZeRO-1
        self._per_d: dict[int, PipelineFloors] = {1: self.plain}
        self._plain_d: dict[int, PipelineFloors] = {1: self.plain}

    def floors_for(self, d: int) -> PipelineFloors:
        if d not in self._per_d:
            self._per_d[d] = PipelineFloors(self.tb, d)
        return self._per_d[d]

    def plain_for(self, d: int) -> PipelineFloors:
        """Floors without sync and with D's memory: the D = 1 table, but under ZeRO-1, where
        a plan of D ≥ 2 fits more layers per stage (§11), D's own."""
        if self.tb.training.zero_stage != 1:
            return self.plain
        if d not in self._plain_d:
            self._plain_d[d] = PipelineFloors(self.tb, 1, memory_pipelines=d)
        return self._plain_d[d]

    @staticmethod
    def fits(floors: PipelineFloors, d: int, threshold: float, deadline: float = math.inf) -> bool:
        """Is there a choice of D allocations fitting the machines and m_p summing to B/b
        with every pipe_floor[m_p, a_p] ≤ threshold? (Pipelines in non-increasing m [R2].)
        The work grows with (B/b)²·D: past `deadline` (perf_counter) it raises OutOfTime (a
        budget level of 8 GPUs and B/b = 1,024 took 50 s in a 6 s solve)."""
        fl, total = floors, floors.tb.total_micro
        ok = fl.table <= threshold  # [m, a]
        shape = tuple(reversed(fl.radix))
        # reach[m_last, s, usage grid]: after some pipelines, last m, micro-batches used
        reach = np.zeros((total + 1, total + 1, *shape), dtype=bool)
        minimal = {m: DBounds._minimal(ok[m].reshape(shape)) for m in range(1, total + 1)}
        for m in range(1, total + 1):
            for a in minimal[m]:
                reach[m, m][a] = True
        for _ in range(d - 1):
            nxt = np.zeros_like(reach)
            for m_prev in range(1, total + 1):
                if time.perf_counter() > deadline:
                    raise OutOfTime
                for s in range(1, total + 1):
                    here = reach[m_prev, s]
                    if not here.any():
                        continue
                    for m in range(1, min(m_prev, total - s) + 1):
                        for a in minimal[m]:
                            src = tuple(slice(0, n - ai) for n, ai in zip(shape, a))
                            dst = tuple(slice(ai, n) for n, ai in zip(shape, a))
                            nxt[m, s + m][dst] |= here[src]
            reach = nxt
        return bool(reach[:, total].any())

    @staticmethod
    def _minimal(grid: np.ndarray) -> list[tuple[int, ...]]:
        """The minimal cells of an up-closed boolean grid (grid axes: machines reversed)."""
        cells = [tuple(c) for c in np.argwhere(grid)]
        return [c for c in cells
                if not any(c[k] > 0 and grid[c[:k] + (c[k] - 1,) + c[k + 1:]] for k in range(len(c)))]

    def bound(self, d: int, deadline: float = math.inf) -> float:
        """[B2] with the D-aware floors (last-stage sync) where D pipelines fit at all (raises
        OutOfTime past `deadline`)."""
        plain = self._bound(d, self.plain_for(d), deadline)
        if d < 2 or plain == float("inf"):
            return plain
        return max(plain, self._bound(d, self.floors_for(d), deadline) - self.tb.dp_floor(d))

    def _bound(self, d: int, floors: PipelineFloors, deadline: float) -> float:
        """The least pipe-floor value v such that D pipelines fit with every floor ≤ v (found
        by bisection over the table's values), plus T_dp's floor; +inf when no D pipelines
        fit at all."""
        values = np.unique(floors.table[np.isfinite(floors.table)])
        if not len(values) or not self.fits(floors, d, values[-1], deadline):
            return float("inf")
        lo, hi = 0, len(values) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits(floors, d, values[mid], deadline):
                hi = mid
            else:
                lo = mid + 1
        return float(values[lo]) + self.tb.dp_floor(d)


@dataclass(frozen=True)
class Candidate:
    """A pipeline's stage-type multiset and micro-batch count whose floor is below the cutoff."""

    shape: Shape
    micro_batches: int
    floor: float
    order: tuple[int, ...] | None = None  # stage types in pipeline order, when fixed [B5]


def structures(floors: PipelineFloors, d: int, cutoff: float, limit: int) -> list[list[Candidate]] | None:
    """[B4] Every multiset of D candidates (pipelines in non-increasing m_p [R2]) that fits
    the machines with Σ m_p = B/b, each pipeline's floor below the cutoff: every plan with
    D pipelines and T < cutoff has this form. None when there are more than `limit`."""
    floors.table  # computes the per-shape floors
    total = floors.tb.total_micro
    by_m: dict[int, list[Candidate]] = {m: [] for m in range(1, total + 1)}
    for shape, f in floors.shape_floors:
        for m in range(1, total - d + 2):
            if f[m] < cutoff:
                by_m[m].append(Candidate(shape, m, float(f[m])))
    usage = {m: np.array([c.shape.usage for c in group]).reshape(len(group), len(floors.counts))
             for m, group in by_m.items()}
    out: list[list[Candidate]] = []

    def grow(chosen: list[Candidate], free: list[int], left: int, top_m: int, start: int) -> bool:
        need = d - len(chosen)
        if need == 0:
            out.append(list(chosen))
            return len(out) <= limit
        low = -(-left // need)  # the rest have m ≤ this one's, so this one has m ≥ ⌈left/need⌉
        for m in range(min(top_m, left - need + 1), low - 1, -1):
            group, first = by_m[m], start if m == top_m else 0
            for i in first + np.flatnonzero((usage[m][first:] <= np.array(free)).all(axis=1)):
                c = group[i]
                chosen.append(c)
                ok = grow(chosen, [f - u for f, u in zip(free, c.shape.usage)], left - m, m, int(i))
                chosen.pop()
                if not ok:
                    return False
        return True

    return out if grow([], list(floors.counts), total, total, 0) else None


def ordered_floor(floors: PipelineFloors, order: tuple[int, ...], m: int) -> float:
    """[B5] The least T_pipe + the last stage's sync over every layer split of a pipeline with
    its stage types in this order: exact memory caps (first, last, q of the schedule: 1F1B
    min(S − k, m), GPipe m) and the
    exact T_pp of each boundary; for D = 1 it is the pipeline's optimum itself (with a tied
    model's sync between its first and last stage, `_tied_sync_of_order`)."""
    tb, big_l = floors.tb, floors.tb.layers
    floors.table  # the sync floors
    idx, s = np.array(order), len(order)
    q = np.minimum(cost.in_flight_micro_batches(tb.training, s, np.arange(s), m), tb.q_top)
    caps = np.array([floors.n_max[c, int(k == 0), int(k == s - 1), int(q[k])] for k, c in enumerate(order)])
    if caps.min() < 1 or caps.sum() < big_l:
        return float("inf")
    pp = [tb.pp_link[tb.types[a].machine, tb.types[b].machine] + tb.pp_bcast[b] for a, b in zip(order, order[1:])]
    sync = (floors.dp_layer[idx[-1]], max(floors.dp_head[idx[-1]], _tied_sync_of_order(floors, order)))
    micro = np.array([max(m - 1, 0)])
    a, h = tb.tau_layer[idx], tb.tau_head[idx]
    return float(floors._split_floor(a, h, caps, s - 1, micro, sync, max(pp, default=0.0))[0] + sum(pp))


def _tied_sync_of_order(floors: PipelineFloors, order: tuple[int, ...]) -> float:
    """A floor of a tied model's sync when a pipeline's first and last stage are these (S ≥ 2):
    both are holders, so n ≥ D + 1 (2 when D = 1: then n = 2 and this is its exact τ), t_min ≤
    the smaller TP, bw_min ≤ and α_max ≥ their pair's link [3.4]; 0 otherwise."""
    tb = floors.tb
    if not tb.tied or len(order) < 2:
        return 0.0
    first, last = tb.types[order[0]], tb.types[order[-1]]
    n, t = floors.d + 1, min(first.tp, last.tp)
    return tb.tied_bw_part(n, t, first.machine, last.machine) + tb.tied_lat_part(n, first.machine, last.machine)


def ordered_structures(floors: PipelineFloors, combos: list[list[Candidate]], cutoff: float,
                       limit: int) -> list[list[Candidate]] | None:
    """[B5] Each structure with every pipeline's stage order spelled out, keeping the orders
    whose floor is below the cutoff; None when there are more than `limit`."""
    out = []
    for combo in combos:
        options = []
        for cand in combo:
            orders = sorted(set(itertools.permutations(cand.shape.stages)))
            kept = [(ordered_floor(floors, o, cand.micro_batches), o) for o in orders]
            options.append([Candidate(cand.shape, cand.micro_batches, f, o) for f, o in kept if f < cutoff])
        for choice in itertools.product(*options):
            out.append(list(choice))
            if len(out) > limit:
                return None
    return out
