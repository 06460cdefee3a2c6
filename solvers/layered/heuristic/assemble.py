"""Pools → a complete plan: phase 2 for every pool, the batch split, the memory repair.

`build_plan` is public: the random-partition baseline hands it its own pools and so runs
exactly the heuristic's phase 2.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import replace
from typing import Sequence

import numpy as np

from planner.layered import cost
from planner.layered.pricing import breakdown, stage_shapes, stage_times
from planner.layered.plan import Plan
from planner.problem import Problem
from planner.layered.table import StageTable, first_layers, stage_table
from solvers.layered.heuristic.options import HeuristicOptions
from solvers.layered.heuristic.pipeline import PipelineLimits, StageSlot, build_pipeline


def make_plan(problem: Problem, pipelines: list[list[StageSlot]], layers: list[np.ndarray],
              micro: Sequence[int]) -> Plan:
    """The plan of these stage slots with these layer counts and micro-batches per pipeline."""
    b = problem.training.micro_batch
    return Plan.from_stages(problem=problem.name, batches=[int(m) * b for m in micro], stages=[
        [(s.devices, n) for s, n in zip(slots, ns)] for slots, ns in zip(pipelines, layers)])


def plan_from_table(problem: Problem, plan: Plan, table: StageTable) -> Plan:
    """The plan's structure with the table's layer and batch split."""
    return Plan.from_stages(problem=plan.problem, batches=table.batch, stages=[
        [(s.devices, n) for s, n in zip(pipe.stages, layers)]
        for pipe, layers in zip(plan.pipelines, table.per_pipeline(table.layers))])


def with_split(table: StageTable, layers: np.ndarray, micro: np.ndarray, micro_batch: int) -> StageTable:
    """The same structure with other layer counts and micro-batch counts."""
    return replace(table, layers=layers, first_layer=first_layers(layers, table.pipe, table.pipe_start),
                   micro_batches=micro[table.pipe], batch=micro * micro_batch)


def pipe_time_coefficients(problem: Problem, table: StageTable) -> tuple[np.ndarray, np.ndarray]:
    """Per pipeline: T_pipe with one micro-batch, and what each further one adds [3.3]."""
    d = table.num_pipelines
    one = breakdown(problem, with_split(table, table.layers, np.ones(d, int), problem.training.micro_batch))
    two = breakdown(problem, with_split(table, table.layers, np.full(d, 2), problem.training.micro_batch))
    return one.pipe_time, two.pipe_time - one.pipe_time


def split_batches(problem: Problem, table: StageTable, equal: bool) -> np.ndarray | None:
    """Micro-batches per pipeline (m_p ≥ 1, Σ m_p = B/b): each one goes to the pipeline whose
    T_pipe it raises least (optimal for the max); with `equal`, as even as the count allows."""
    total, d = problem.training.micro_batches, table.num_pipelines
    if d > total:
        return None
    if equal:
        return np.array([total // d + (p < total % d) for p in range(d)])
    base, step = pipe_time_coefficients(problem, table)
    return 1 + greedy_increments(base, step, total - d)


def _taken(base: np.ndarray, step: np.ndarray, v: float, cap: int) -> np.ndarray:
    """Per pipeline: how many k ≥ 1 have base + k·step ≤ v (as the heap computes it), at most
    `cap`. base + k·step rounds monotonically in k, so a float estimate needs at most a few
    corrections."""
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.where(step > 0, np.floor((v - base) / np.where(step > 0, step, 1.0)), cap)
    k = np.clip(np.nan_to_num(guess, nan=0.0, posinf=cap, neginf=0.0), 0, cap).astype(np.int64)
    k = np.where((step == 0) & (base + step > v), 0, k)
    while np.any(over := (k > 0) & (base + k * step > v)):
        k = k - over
    while np.any(under := (k < cap) & (base + (k + 1) * step <= v)):
        k = k + under
    return k


def greedy_increments(base: np.ndarray, step: np.ndarray, extra: int) -> np.ndarray:
    """Hand out `extra` micro-batches one at a time, each to the pipeline p whose next value
    base[p] + k·step[p] (k: its count so far plus one) is least, ties to the lower p — the
    heap's answer: the `extra` first of all the values in the order (value, p). Found without
    the heap's O(extra·log D) loop: from the water level where the counts sum to `extra`
    (`_corrected_at_level`), or by bisection on the value of the last one handed out."""
    base, step = np.asarray(base, dtype=float), np.asarray(step, dtype=float)
    if extra <= 0:
        return np.zeros(len(base), dtype=np.int64)
    if np.any(base + step < 0) or np.any(step < 0):
        raise ValueError("pipeline times must not fall with more micro-batches")
    if len(base) <= HEAP_CORRECTION_PIPELINES and np.all(step > 0):
        return _corrected_at_level(base, step, extra, _water_level(base, step, extra))
    return _bisected(base, step, extra)


# Up to this many pipelines the counts at the water level are corrected by a heap (at most
# about one step per pipeline); above, by bisection, whose 64 vector rounds cost less there.
HEAP_CORRECTION_PIPELINES = 512


def _water_level(base: np.ndarray, step: np.ndarray, extra: int) -> float:
    """The v where Σ_p max(0, (v − base_p)/step_p) = extra (steps > 0): the counts' continuous
    solution, whose floors sum to within D of `extra`. The pipelines under the level are a
    prefix of them by base: each that joins lowers the level, never below its own base."""
    order = np.argsort(base, kind="stable")
    inverse = 1.0 / step[order]
    sum_base, sum_inverse, level = 0.0, 0.0, -np.inf
    for i, p in enumerate(order):
        if base[p] >= level and i:
            break
        sum_base += base[p] * inverse[i]
        sum_inverse += inverse[i]
        level = (extra + sum_base) / sum_inverse
    return float(level)


def _corrected_at_level(base: np.ndarray, step: np.ndarray, extra: int, level: float) -> np.ndarray:
    """Every value at or below `level` taken (a prefix of the order (value, p)), then the next
    values added, or the last ones taken back, one at a time in that order until `extra` are
    taken: still a prefix, so the heap's answer from any level; from the water level, in at
    most about D steps (taking back only where the level's float rounding overshot)."""
    taken = _taken(base, step, level, extra)
    have = int(taken.sum())
    if have < extra:
        heap = [(base[p] + (taken[p] + 1) * step[p], p) for p in range(len(base))]
        heapq.heapify(heap)
        for _ in range(extra - have):
            _, p = heapq.heappop(heap)
            taken[p] += 1
            heapq.heappush(heap, (base[p] + (taken[p] + 1) * step[p], p))
    elif have > extra:  # the last taken, largest (value, p) first
        heap = [(-(base[p] + taken[p] * step[p]), -p) for p in range(len(base)) if taken[p] > 0]
        heapq.heapify(heap)
        for _ in range(have - extra):
            _, minus_p = heapq.heappop(heap)
            taken[-minus_p] -= 1
            if taken[-minus_p] > 0:
                heapq.heappush(heap, (-(base[-minus_p] + taken[-minus_p] * step[-minus_p]), minus_p))
    return taken


def _bisected(base: np.ndarray, step: np.ndarray, extra: int) -> np.ndarray:
    """The same answer by bisection on the value of the last one handed out (over the bits of a
    non-negative float64, which order like the floats), in O(D·64)."""
    lo, hi = 0, int(np.float64(np.min(base + extra * step)).view(np.int64))
    while lo < hi:  # the smallest value v with at least `extra` next-values ≤ v
        mid = (lo + hi) // 2
        if _taken(base, step, float(np.int64(mid).view(np.float64)), extra).sum() >= extra:
            hi = mid
        else:
            lo = mid + 1
    v = float(np.int64(lo).view(np.float64))
    below = _taken(base, step, float(np.nextafter(v, -np.inf)), extra) if lo > 0 else np.zeros(len(base), np.int64)
    ties = _taken(base, step, v, extra) - below  # values equal to v: the lower p first
    room = extra - int(below.sum())
    take = np.minimum(ties, np.maximum(room - (np.cumsum(ties) - ties), 0))
    return below + take


def repair_memory(problem: Problem, table: StageTable) -> np.ndarray | None:
    """Move layers off out-of-memory stages onto stages of the same pipeline with headroom,
    each layer to the stage whose τ it raises least. Returns the new layer counts, or None
    when some stage cannot fit even one layer or the pipeline has no headroom left."""
    model, training = problem.model, problem.training
    cap = problem.cluster.machine_memory_bytes[table.machine]
    fits = cost.max_layers_fitting(model, training, stage_shapes(problem, table), cap)
    tau_layer = stage_times(problem, replace(table, layers=np.ones_like(table.layers)))[2]
    layers = table.layers.copy()
    for p in range(table.num_pipelines):
        lo, hi = table.pipe_start[p], table.pipe_start[p + 1]
        if np.any(fits[lo:hi] < 1) or fits[lo:hi].sum() < model.layers:
            return None
        for k in range(lo, hi):
            while layers[k] > fits[k]:
                room = np.flatnonzero(layers[lo:hi] < fits[lo:hi]) + lo
                j = room[np.argmin(layers[room] * tau_layer[room])]  # least-loaded with headroom
                layers[k] -= 1
                layers[j] += 1
    return layers


def build_plan(problem: Problem, pools: Sequence[Sequence[int]], heuristic: HeuristicOptions | None = None, *,
               tp_cap: int | None = None, max_stages: int | None = None,
               cache: dict | None = None, deadline: float | None = None) -> Plan | None:
    """Phase 2 for every pool, then batches by pipeline speed and the memory repair.

    Pools that cannot hold the model are left idle, and so are the pools not yet built when
    `deadline` (perf_counter) passes; None if no pool can hold the model, or if there are
    more pipelines than micro-batches."""
    heuristic = heuristic or HeuristicOptions()
    pools = [np.asarray(p) for p in pools if len(p)]
    micro_est = max(1, problem.training.micro_batches // max(1, len(pools)))
    limits = PipelineLimits(micro=micro_est, tp_cap=tp_cap, fixed_tp=heuristic.fixed_tp,
                            beam_width=heuristic.beam_width, max_stages=max_stages, pipelines=len(pools))
    built = []
    for pool in pools:  # past the deadline, the pools not yet built are left idle (anytime)
        if built and deadline is not None and time.perf_counter() > deadline:
            break
        one = build_pipeline(problem, pool, limits=limits, cache=cache)
        if one is not None:
            built.append(one)
    if not built or len(built) > problem.training.micro_batches:
        return None
    draft = make_plan(problem, [s for s, _ in built], [n for _, n in built], [1] * len(built))
    table = stage_table(problem, draft)
    micro = split_batches(problem, table, heuristic.equal_batch)
    table = with_split(table, table.layers, micro, problem.training.micro_batch)
    fixed = repair_memory(problem, table)
    if fixed is None:
        return None
    return plan_from_table(problem, draft, with_split(table, fixed, micro, problem.training.micro_batch))
