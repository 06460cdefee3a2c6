"""The one evaluator: prices a plan under DESIGN.md §3 (numpy over stages and layers).

`breakdown` returns every term as arrays; `iteration_time` is the fast path the heuristic
calls in its inner loop; `evaluate` wraps the same numbers into a typed `Estimate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner import cost
from planner.estimate import Bottleneck, Estimate
from planner.hardware import GIB
from planner.plan import Plan
from planner.problem import Problem
from planner.table import StageTable, stage_table


class InvalidPlanError(ValueError):
    """Raised when a plan cannot be priced; carries every violation found."""

    def __init__(self, violations):
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"plan is invalid ({len(self.violations)} violations):\n{lines}")


@dataclass(frozen=True)
class Breakdown:
    compute: np.ndarray  # C_σ per stage [3.1]
    tp: np.ndarray  # T_tp,σ
    tau: np.ndarray  # τ_σ
    pp: np.ndarray  # T_pp,k (0 for last stages) [3.2]
    dp: np.ndarray  # Σ τ_dp over the stage's layers [3.4]
    memory: np.ndarray  # bytes per device [3.5]
    capacity: np.ndarray  # bytes per device of the stage's GPU type
    pipe_time: np.ndarray  # T_pipe per pipeline [3.3]
    bubble: np.ndarray  # Σ τ + Σ T_pp per pipeline
    dp_time: float  # T_dp
    iteration: float  # T [3.6]


def stage_times(problem: Problem, table: StageTable):
    """C, T_tp, τ and T_pp of every stage [3.1, 3.2]."""
    model, training, cluster = problem.model, problem.training, problem.cluster
    bw, lat = cluster.bw_matrix, cluster.lat_matrix
    mach = table.machine
    compute = cost.stage_compute_time(
        model, training, cluster.machine_flops[mach], table.tp, table.layers, table.last
    )
    tp = cost.stage_tp_time(model, training, table.tp, table.layers, bw[mach, mach], lat[mach, mach])
    nxt = np.minimum(np.arange(len(mach)) + 1, len(mach) - 1)  # next stage (ignored for last)
    pp = cost.stage_pp_time(
        model, training, bw[mach, mach[nxt]], lat[mach, mach[nxt]],
        table.tp[nxt], bw[mach[nxt], mach[nxt]], lat[mach[nxt], mach[nxt]],
    )
    pp = np.where(table.last == 1, 0.0, pp)
    return compute, tp, compute + tp, pp


def dp_layer_times(problem: Problem, table: StageTable) -> np.ndarray:
    """τ_dp of every layer, then of "emb" and "head": an array of length L + 2 [3.4]."""
    model, training, cluster = problem.model, problem.training, problem.cluster
    d, big_l = table.num_pipelines, model.layers
    if d == 1:
        return np.zeros(big_l + 2)
    holders = np.repeat(np.arange(len(table.pipe)), table.layers).reshape(d, big_l)
    # layers whose holders are the same stages share one τ_dp: price each run once
    change = np.flatnonzero(np.any(holders[:, 1:] != holders[:, :-1], axis=0)) + 1
    starts = np.concatenate([[0], change])
    # one row per distinct run of layers, then "emb" and "head": the D holding stages
    columns = np.vstack([holders[:, starts].T, table.pipe_start[:-1], table.pipe_start[1:] - 1])
    params = np.array([model.params_per_layer] * len(starts) + [model.params_embedding, model.params_head])
    bw_min, lat_max = cost.holders_bw_lat_rows(table.machine[columns], cluster.bw_matrix, cluster.lat_matrix)
    tau = cost.dp_layer_time(d, params, training, table.tp[columns].min(axis=1), bw_min, lat_max)
    lengths = np.diff(np.concatenate([starts, [big_l]]))
    return np.concatenate([np.repeat(tau[: len(starts)], lengths), tau[len(starts):]])


def stage_dp_times(table: StageTable, tau_dp: np.ndarray) -> np.ndarray:
    """Σ τ_dp over the layers (and pseudo-layers) each stage holds."""
    big_l = len(tau_dp) - 2
    csum = np.concatenate([[0.0], np.cumsum(tau_dp[:big_l])])
    own = csum[table.first_layer + table.layers] - csum[table.first_layer]
    return own + table.first * tau_dp[big_l] + table.last * tau_dp[big_l + 1]


def stage_memory(problem: Problem, table: StageTable) -> np.ndarray:
    """Bytes per device of each stage [3.5]."""
    q = cost.in_flight_micro_batches(table.num_stages, table.index, table.micro_batches)
    return cost.stage_memory_bytes(
        problem.model, problem.training, table.tp, table.layers, table.first, table.last, q
    )


def breakdown(problem: Problem, table: StageTable) -> Breakdown:
    compute, tp, tau, pp = stage_times(problem, table)
    starts = table.pipe_start[:-1]
    bubble = np.add.reduceat(tau + pp, starts)
    steady = np.maximum.reduceat(np.maximum(tau, pp), starts)
    pipe_time = bubble + (table.batch // problem.training.micro_batch - 1) * steady
    dp = stage_dp_times(table, dp_layer_times(problem, table))
    dp_time = float(dp.max())
    return Breakdown(
        compute=compute, tp=tp, tau=tau, pp=pp, dp=dp,
        memory=stage_memory(problem, table),
        capacity=problem.cluster.machine_memory_bytes[table.machine],
        pipe_time=pipe_time, bubble=bubble,
        dp_time=dp_time, iteration=float(pipe_time.max()) + dp_time,
    )


def _require_valid_structure(problem: Problem, plan: Plan) -> None:
    from planner.validate import structural_violations  # validate imports this module

    violations = structural_violations(problem, plan)
    if violations:
        raise InvalidPlanError(violations)


def iteration_time(problem: Problem, plan: Plan, check: bool = True) -> float:
    """T of DESIGN.md §3.6 only: the heuristic's inner loop."""
    if check:
        _require_valid_structure(problem, plan)
    return breakdown(problem, stage_table(problem, plan)).iteration


def evaluate(problem: Problem, plan: Plan) -> Estimate:
    """Price a plan: T with all its parts, throughput, MFU, memory and the bottleneck.

    Raises InvalidPlanError when the plan cannot be priced (unknown devices, a stage across
    machines, layers not summing to L, bad batches); an out-of-memory plan is priced and
    shows negative headroom (use `validate` to reject it)."""
    _require_valid_structure(problem, plan)
    table = stage_table(problem, plan)
    b = breakdown(problem, table)
    stages = _stage_rows(problem, plan, table, b)
    micro = problem.training.micro_batch
    pipelines = [
        {"index": p, "batch": batch, "micro_batches": batch // micro, "time_s": time_s,
         "bubble_s": bubble_s, "steady_s": time_s - bubble_s, "stages": stages[lo:hi]}
        for p, (batch, time_s, bubble_s, lo, hi) in enumerate(zip(
            table.batch.tolist(), b.pipe_time.tolist(), b.bubble.tolist(),
            table.pipe_start[:-1].tolist(), table.pipe_start[1:].tolist()))
    ]
    tokens = problem.training.global_batch * problem.training.seq_len
    flops = cost.iteration_flops(problem.model, problem.training)
    # one validation of the whole nested mapping: far cheaper than one model per stage
    return Estimate.model_validate({
        "iteration_s": b.iteration, "pipe_s": float(b.pipe_time.max()), "dp_s": b.dp_time,
        "tokens_per_s": tokens / b.iteration,
        "mfu": flops / (b.iteration * problem.cluster.total_peak_flops),
        "min_headroom_gib": float((b.capacity - b.memory).min() / GIB),
        "pipelines": pipelines, "bottleneck": find_bottleneck(problem, table, b),
    })


_STAGE_FIELDS = ("pipeline", "index", "machine", "devices", "tp", "layers", "first_layer",
                 "compute_s", "tp_s", "tau_s", "pp_s", "dp_s", "memory_gib", "capacity_gib",
                 "headroom_gib")


def _stage_rows(problem, plan, table, b: Breakdown) -> list[dict]:
    """The fields of each StageEstimate; arrays go to Python numbers in bulk (tolist)."""
    names = [m.name for m in problem.cluster.machines]
    columns = (
        table.pipe.tolist(), table.index.tolist(), [names[m] for m in table.machine.tolist()],
        [s.devices for p in plan.pipelines for s in p.stages], table.tp.tolist(),
        table.layers.tolist(), table.first_layer.tolist(), b.compute.tolist(), b.tp.tolist(),
        b.tau.tolist(), b.pp.tolist(), b.dp.tolist(), (b.memory / GIB).tolist(),
        (b.capacity / GIB).tolist(), ((b.capacity - b.memory) / GIB).tolist(),
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
                        f"takes {b.dp_time:.4g} s, more than the slowest pipeline ({b.pipe_time[p]:.4g} s)",
        )
    lo, hi = table.pipe_start[p], table.pipe_start[p + 1]
    i = lo + int(np.argmax(np.maximum(b.tau[lo:hi], b.pp[lo:hi])))
    parts = {"compute": b.compute[i], "tensor_parallel": b.tp[i], "pipeline_parallel": b.pp[i]}
    kind = "pipeline_parallel" if b.pp[i] > b.tau[i] else max(
        ("compute", "tensor_parallel"), key=parts.__getitem__)
    machine = problem.cluster.machines[table.machine[i]].name
    return Bottleneck(
        kind=kind, pipeline=p, stage=int(table.index[i]), seconds=float(b.pipe_time[p]),
        description=f"pipeline {p} (T_pipe {b.pipe_time[p]:.4g} s) is limited by stage "
                    f"{table.index[i]} on {machine} (t={table.tp[i]}, {table.layers[i]} layers): "
                    f"{kind.replace('_', ' ')} {parts[kind]:.4g} s per micro-batch",
    )
