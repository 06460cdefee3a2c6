"""Pools → a complete plan: phase 2 for every pool, the batch split, the memory repair.

`build_plan` is public: the random-partition baseline hands it its own pools and so runs
exactly the heuristic's phase 2.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import numpy as np

from planner.layered import cost
from planner.layered.pricing import breakdown, stage_shapes, stage_times
from planner.layered.plan import Plan
from planner.problem import Problem
from planner.layered.table import StageTable, first_layers, stage_table
from solvers.batch_split import greedy_increments
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
