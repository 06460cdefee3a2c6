"""The evaluator of layered plans: T with every part of docs/cost-model.md §3 as a typed `Estimate`,
and the bottleneck that sets it. The numbers themselves come from `planner.layered.pricing`."""

from __future__ import annotations

import numpy as np

from planner import cost
from planner.base import GIB, format_seconds
from planner.layered.estimate import Bottleneck, Estimate
from planner.layered.plan import Plan
from planner.layered.pricing import Breakdown, breakdown, iteration_time, require_valid_structure
from planner.layered.simulated import forward_time, simulated_pipe_times
from planner.layered.table import StageTable, stage_table
from planner.prices import cost_of, rent_per_hour
from planner.problem import Problem
from planner.base import plural

__all__ = ["evaluate", "find_bottleneck", "iteration_time"]


def evaluate(problem: Problem, plan: Plan) -> Estimate:
    """Price a plan: T with all its parts, throughput, MFU, memory and the bottleneck.

    Raises InvalidPlanError when the plan cannot be priced (unknown devices, a stage across
    machines, layers not summing to L, bad batches); an out-of-memory plan is priced and
    shows negative headroom (use `validate` to reject it)."""
    require_valid_structure(problem, plan)
    table = stage_table(problem, plan)
    b = breakdown(problem, table)
    stages = _stage_rows(problem, plan, table, b)
    micro = problem.training.micro_batch
    simulated = simulated_pipe_times(problem.training, table, b.compute, b.tp, b.tau, b.pp)
    pipelines = [
        {"index": p, "batch": batch, "micro_batches": batch // micro, "time_s": time_s,
         "bubble_s": bubble_s, "steady_s": time_s - bubble_s, "simulated_s": sim_s, "stages": stages[lo:hi]}
        for p, (batch, time_s, bubble_s, sim_s, lo, hi) in enumerate(zip(
            table.batch.tolist(), b.pipe_time.tolist(), b.bubble.tolist(), simulated.tolist(),
            table.pipe_start[:-1].tolist(), table.pipe_start[1:].tolist()))
    ]
    rent = rent_per_hour(problem, plan)
    # one validation of the whole nested mapping: far cheaper than one model per stage
    return Estimate.model_validate({
        "iteration_s": b.iteration, "pipe_s": float(b.pipe_time.max()), "dp_s": b.dp_time,
        "simulated_s": float(simulated.max()) + b.dp_time,
        "tokens_per_s": cost.tokens_per_second(problem.training, b.iteration),
        "mfu": cost.model_flops_utilization(problem.model, problem.training, b.iteration,
                                            problem.cluster.total_peak_flops),
        "min_headroom_gib": float((b.capacity - b.memory).min() / GIB),
        "rent_per_hour": rent, "cost_per_mtok": cost_of(problem, rent, b.iteration),
        "pipelines": pipelines, "bottleneck": find_bottleneck(problem, table, b),
    })


_STAGE_FIELDS = ("pipeline", "index", "machine", "devices", "tp", "layers", "first_layer",
                 "compute_s", "tp_s", "tau_s", "forward_s", "pp_s", "dp_s", "memory_gib", "states_gib",
                 "activations_gib", "capacity_gib", "headroom_gib")


def _stage_rows(problem, plan, table, b: Breakdown) -> list[dict]:
    """The fields of each StageEstimate; arrays go to Python numbers in bulk (tolist)."""
    names = [m.name for m in problem.cluster.machines]
    columns = (
        table.pipe.tolist(), table.index.tolist(), [names[m] for m in table.machine.tolist()],
        [s.devices for p in plan.pipelines for s in p.stages], table.tp.tolist(),
        table.layers.tolist(), table.first_layer.tolist(), b.compute.tolist(), b.tp.tolist(),
        b.tau.tolist(), forward_time(problem.training, b.compute, b.tp).tolist(), b.pp.tolist(), b.dp.tolist(), (b.memory / GIB).tolist(),
        (b.states / GIB).tolist(), (b.activations / GIB).tolist(), (b.capacity / GIB).tolist(), ((b.capacity - b.memory) / GIB).tolist(),
    )
    return [dict(zip(_STAGE_FIELDS, row)) for row in zip(*columns)]


def find_bottleneck(problem: Problem, table: StageTable, b: Breakdown) -> Bottleneck:
    """The term that sets T: the DP sync if it outweighs the slowest pipeline, else that
    pipeline's limiting stage and whether compute, TP or PP traffic limits it."""
    p = int(np.argmax(b.pipe_time))
    if b.dp_time > b.pipe_time[p]:
        i = int(np.argmax(b.dp))
        return Bottleneck(
            kind="data_parallel", pipeline=int(table.pipe[i]), stage=int(table.index[i]),
            seconds=b.dp_time,
            description=f"gradient sync of pipeline {table.pipe[i]} stage {table.index[i]} "
                        f"takes {format_seconds(b.dp_time)}, more than the slowest pipeline ({format_seconds(b.pipe_time[p])})",
        )
    lo, hi = table.pipe_start[p], table.pipe_start[p + 1]
    i = lo + int(np.argmax(np.maximum(b.tau[lo:hi], b.pp[lo:hi])))
    parts = {"compute": b.compute[i], "tensor_parallel": b.tp[i], "pipeline_parallel": b.pp[i]}
    kind = "pipeline_parallel" if b.pp[i] > b.tau[i] else max(
        ("compute", "tensor_parallel"), key=parts.__getitem__)
    machine = problem.cluster.machines[table.machine[i]].name
    return Bottleneck(
        kind=kind, pipeline=p, stage=int(table.index[i]), seconds=float(b.pipe_time[p]),
        description=f"pipeline {p} (T_pipe {format_seconds(b.pipe_time[p])}) is limited by stage "
                    f"{table.index[i]} on {machine} (t={table.tp[i]}, {plural(table.layers[i], 'layer')}): "
                    f"{kind.replace('_', ' ')} {format_seconds(parts[kind])} per micro-batch",
    )
