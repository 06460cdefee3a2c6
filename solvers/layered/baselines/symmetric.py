"""The symmetric baseline: what Megatron-LM runs, priced by the one cost model.

Megatron trains with one dp×pp×tp layout for the whole job. The rules used here:
- tp is a power of two dividing the heads a and the kv heads k, and a tp group never spans
  machines: each machine (in file order) is cut into consecutive blocks of tp devices, and a
  machine's leftover devices (count mod tp) stay idle;
- pp divides L and every stage holds L/pp layers (Megatron's `num_layers % pp == 0`);
- every pipeline gets B/dp sequences, so dp·b must divide B;
- ranks are laid out in file order, as Megatron numbers them on the nodes it is given: the
  first dp·pp blocks are used, block j going either to stage j // dp of pipeline j % dp
  (Megatron's default rank order tp-dp-pp) or to stage j % pp of pipeline j // pp
  (`--use-tp-pp-dp-mapping`). Both orders are tried: the baseline is the better of them.
With mixed GPU types, a stage simply lands on whatever GPUs come next in the file.

`symmetric` may leave devices idle (dp·pp·tp ≤ N, as when a user hands Megatron the first
nodes only); `symmetric-all` must use every device (dp·pp·tp = N and tp divides every
machine's count), as Megatron does when it is handed the whole cluster. Each layout is
checked with `planner.validate` (memory first on its stage table, `fits_memory`: a layout that
does not fit is dropped before its plan is built) and priced by `iteration_time`; the best T wins.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Literal

import numpy as np
from pydantic import Field

from planner.base import plural
from planner.layered.pricing import iteration_time, stage_memory
from planner.layered.table import StageTable, table_of_stages
from planner.base import Frozen
from planner.layered.plan import Plan
from planner.solver_info import SolverInfo, SolveStatus
from planner.problem import Problem
from planner.layered.validate import validate
from solvers.common import SolveResult, SolverOptions

RankOrder = Literal["tp-dp-pp", "tp-pp-dp"]


class SymmetricLayout(Frozen):
    """One Megatron configuration: degrees and the order ranks are laid out in."""

    dp: int = Field(ge=1, description="data-parallel degree (pipelines)")
    pp: int = Field(ge=1, description="pipeline-parallel degree (stages per pipeline)")
    tp: int = Field(ge=1, description="tensor-parallel degree (devices per stage)")
    order: RankOrder = Field(default="tp-dp-pp", description="Megatron rank order")

    def __str__(self) -> str:
        return f"dp={self.dp} pp={self.pp} tp={self.tp} ({self.order})"


def tp_blocks(problem: Problem, tp: int) -> list[tuple[int, ...]]:
    """Consecutive groups of tp devices inside each machine, machines in file order."""
    cluster = problem.cluster
    blocks = []
    for m in range(len(cluster.machines)):
        devices = cluster.devices_of(m)
        usable = len(devices) - len(devices) % tp
        blocks += [tuple(devices[i:i + tp]) for i in range(0, usable, tp)]
    return blocks


def layout_plan(problem: Problem, layout: SymmetricLayout) -> Plan | None:
    """The plan Megatron would run for `layout`, or None if the blocks do not suffice."""
    blocks = tp_blocks(problem, layout.tp)
    dp, pp = layout.dp, layout.pp
    if len(blocks) < dp * pp:
        return None
    layers = problem.model.layers // pp
    batch = problem.training.global_batch // dp
    return Plan.from_stages(problem=problem.name, batches=[batch] * dp,
                            stages=[[(blocks[block_index(layout, p, k)], layers) for k in range(pp)]
                                    for p in range(dp)])


def block_index(layout: SymmetricLayout, pipe, stage):
    """Which of `tp_blocks` holds stage `stage` of pipeline `pipe` (numbers or arrays): Megatron's
    tp-dp-pp order fills every pipeline's stage 0 first, tp-pp-dp one pipeline at a time."""
    return stage * layout.dp + pipe if layout.order == "tp-dp-pp" else pipe * layout.pp + stage


def layout_table(problem: Problem, layout: SymmetricLayout) -> StageTable:
    """The stage table of `layout_plan`'s plan, from its blocks' machines (a 10^5-device Plan
    object took 0.5 s to build and validate, and the search met a dozen layouts that do not
    fit before the first that does)."""
    blocks = tp_blocks(problem, layout.tp)
    dp, pp = layout.dp, layout.pp
    pipe, stage = np.divmod(np.arange(dp * pp), pp)  # pipeline by pipeline, as plans list stages
    first_device = np.array([block[0] for block in blocks])[block_index(layout, pipe, stage)]
    return table_of_stages(sizes=np.full(dp, pp), machine=problem.cluster.machine_of_device[first_device],
                           tp=np.full(dp * pp, layout.tp), layers=np.full(dp * pp, problem.model.layers // pp),
                           batch=np.full(dp, problem.training.global_batch // dp),
                           micro_batch=problem.training.micro_batch)


def fits_memory(problem: Problem, layout: SymmetricLayout) -> bool:
    """Rule 5 on `layout_table`: what `validate` finds of the plan's memory, before building it."""
    table = layout_table(problem, layout)
    return bool(np.all(stage_memory(problem, table) <= problem.cluster.machine_memory_bytes[table.machine]))


def candidate_layouts(problem: Problem, use_all: bool, options: SolverOptions) -> Iterator[SymmetricLayout]:
    """Every dp×pp×tp that Megatron accepts on this cluster (memory not yet checked)."""
    cluster, model, training = problem.cluster, problem.model, problem.training
    counts = [m.count for m in cluster.machines]
    n, big_l, batch, micro = cluster.num_devices, model.layers, training.global_batch, training.micro_batch
    for tp in model.tp_sizes(max(counts)):
        if use_all and any(c % tp for c in counts):
            continue
        blocks = sum(c // tp for c in counts)
        for pp in (d for d in range(1, big_l + 1) if big_l % d == 0):
            if options.max_stages is not None and pp > options.max_stages:
                continue
            for dp in range(1, blocks // pp + 1):
                if batch % (dp * micro) or (use_all and dp * pp * tp != n):
                    continue
                if options.max_pipelines is not None and dp > options.max_pipelines:
                    continue
                orders: tuple[RankOrder, ...] = ("tp-dp-pp",) if dp == 1 or pp == 1 else ("tp-dp-pp", "tp-pp-dp")
                for order in orders:
                    yield SymmetricLayout(dp=dp, pp=pp, tp=tp, order=order)


def best_symmetric(problem: Problem, use_all: bool, options: SolverOptions,
                   ) -> tuple[SymmetricLayout | None, Plan | None, float, int, bool]:
    """Best valid layout by T: (layout, plan, T, number of layouts tried, whether the time
    limit cut the search: it stops there once a valid layout is found)."""
    best: tuple[SymmetricLayout | None, Plan | None, float] = (None, None, float("inf"))
    tried, deadline = 0, time.perf_counter() + options.time_limit_s
    # most devices first (they fit memory and are what a user tries), larger TP first: a search
    # the time limit cuts has then priced the layouts that matter
    layouts = sorted(candidate_layouts(problem, use_all, options), key=lambda x: (-x.dp * x.pp * x.tp, -x.tp))
    for layout in layouts:
        if best[1] is not None and time.perf_counter() > deadline:
            return (*best, tried, True)
        if not fits_memory(problem, layout):
            tried += 1
            continue
        plan = layout_plan(problem, layout)
        if plan is None:
            continue
        tried += 1
        if validate(problem, plan):  # out of memory (structure is right by construction)
            continue
        t = iteration_time(problem, plan, check=False)
        if t < best[2]:
            best = (layout, plan, t)
    return (*best, tried, False)


def _solve(problem: Problem, options: SolverOptions, use_all: bool) -> SolveResult:
    name = "symmetric-all" if use_all else "symmetric"
    start = time.perf_counter()
    layout, plan, t, tried, cut = best_symmetric(problem, use_all, options)
    wall = time.perf_counter() - start
    restrictions = ("one dp×pp×tp layout, equal layers and batches, devices in file order",)
    if use_all:
        restrictions += ("every device used",)
    if plan is None:
        why = (f"none of the {tried} symmetric layouts fits in memory" if tried
               else "no symmetric layout exists (tp, pp | L, dp·b | B"
                    + (", dp·pp·tp = N with tp dividing every machine" if use_all else "") + ")")
        return SolveResult(solver=name, status=SolveStatus.infeasible, wall_s=wall,
                           restrictions=restrictions, message=why)
    info = SolverInfo(name=name, status=SolveStatus.feasible, objective_s=t, wall_s=wall)
    return SolveResult(solver=name, status=SolveStatus.feasible, plan=plan.model_copy(update={"solver": info}),
                       objective_s=t, wall_s=wall, restrictions=restrictions,
                       message=f"best of {plural(tried, 'layout')}{' (the time limit cut the search)' if cut else ''}: "
                               f"{layout}")


def solve_symmetric(problem: Problem, options: SolverOptions) -> SolveResult:
    """Best Megatron layout; devices may stay idle."""
    return _solve(problem, options, use_all=False)


def solve_symmetric_all(problem: Problem, options: SolverOptions) -> SolveResult:
    """Best Megatron layout that uses every device of the cluster."""
    return _solve(problem, options, use_all=True)
