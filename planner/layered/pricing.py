"""Pricing of layered plans: every term of docs/cost-model.md §3 for all stages of a plan at
once (numpy over stages and layers). The evaluator, the validator's memory rule and the
solvers' inner loops all price through this module; each term's formula lives in
`planner.layered.cost` (and the primitives both kinds share in `planner.cost`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import reserve_bytes
from planner.layered import cost
from planner.layered.cost import StageShape
from planner.layered.holders import cluster_holders_bw_lat
from planner.layered.plan import Plan
from planner.layered.rules import structural_violations
from planner.layered.table import StageTable, stage_table
from planner.problem import Problem
from planner.violations import InvalidPlanError


@dataclass(frozen=True)
class Breakdown:
    compute: np.ndarray  # C_σ per stage [3.1]
    tp: np.ndarray  # T_tp,σ
    tau: np.ndarray  # τ_σ
    pp: np.ndarray  # T_pp,k (0 for last stages) [3.2]
    dp: np.ndarray  # Σ τ_dp over the stage's layers [3.4]
    memory: np.ndarray  # bytes per device [3.5]: states + activations + reserve
    states: np.ndarray  # W_σ, bytes per device
    activations: np.ndarray  # Act_σ, bytes per device
    capacity: np.ndarray  # bytes per device of the stage's GPU type
    pipe_time: np.ndarray  # T_pipe per pipeline [3.3]
    bubble: np.ndarray  # Σ τ + Σ T_pp per pipeline
    dp_time: float  # T_dp
    iteration: float  # T [3.6]


def stage_shapes(problem: Problem, table: StageTable) -> StageShape:
    """Every stage of the table as one `StageShape` of arrays (its machine's figures read off)."""
    q = cost.in_flight_micro_batches(problem.training, table.num_stages, table.index, table.micro_batches)
    return StageShape.on(problem.cluster, table.machine, table.tp, table.layers, first=table.first,
                         last=table.last, in_flight=q, pipelines=table.num_pipelines)


def stage_times(problem: Problem, table: StageTable, shape: StageShape | None = None):
    """C, T_tp, τ and T_pp of every stage [3.1, 3.2]."""
    model, training, cluster = problem.model, problem.training, problem.cluster
    shape = shape if shape is not None else stage_shapes(problem, table)
    compute, tp, tau = cost.stage_time_parts(model, training, shape)
    mach = table.machine
    nxt = np.minimum(np.arange(len(mach)) + 1, len(mach) - 1)  # next stage (ignored for last)
    pp = cost.stage_pp_time(
        model, training, link_bw_gbps=cluster.pair_bw(mach, mach[nxt]), link_lat_s=cluster.pair_lat(mach, mach[nxt]),
        t_next=table.tp[nxt], bw_next_gbps=shape.bw_gbps[nxt], lat_next_s=shape.lat_s[nxt],
    )
    pp = np.where(table.last == 1, 0.0, pp)
    return compute, tp, tau, pp


def dp_layer_times(problem: Problem, table: StageTable) -> np.ndarray:
    """τ_dp of every layer, then of "emb" and "head": an array of length L + 2 [3.4]. A tied
    model's shared pseudo-layer is `tied_sync_time`'s, so its two entries here are 0."""
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
    bw_min, lat_max = cluster_holders_bw_lat(cluster, table.machine[columns])
    tau = cost.dp_layer_time(d, params, training, table.tp[columns].min(axis=1), bw_min, lat_max)
    if model.tied_embeddings:
        tau[len(starts):] = 0.0  # priced once, over all its holders, by tied_sync_time
    lengths = np.diff(np.concatenate([starts, [big_l]]))
    return np.concatenate([np.repeat(tau[: len(starts)], lengths), tau[len(starts):]])


def tied_sync_time(problem: Problem, table: StageTable) -> float:
    """τ_dp of a tied model's shared embedding over its holder stages (the first and the last of
    every pipeline, counted once where they are one stage); 0 for an untied model [3.4]."""
    holders = np.flatnonzero((table.first == 1) | (table.last == 1))
    if not problem.model.tied_embeddings or len(holders) < 2:
        return 0.0
    bw_min, lat_max = cluster_holders_bw_lat(problem.cluster, table.machine[holders][None, :])
    return float(cost.tied_sync_time(problem.model, problem.training, len(holders),
                                     table.tp[holders].min(), bw_min[0], lat_max[0]))


def stage_dp_times(table: StageTable, tau_dp: np.ndarray, tied_s: float = 0.0) -> np.ndarray:
    """Σ τ_dp over the layers (and pseudo-layers) each stage holds; a holder of the tied
    embedding counts its sync once."""
    big_l = len(tau_dp) - 2
    csum = np.concatenate([[0.0], np.cumsum(tau_dp[:big_l])])
    own = csum[table.first_layer + table.layers] - csum[table.first_layer]
    ends = table.first * tau_dp[big_l] + table.last * tau_dp[big_l + 1]
    return own + ends + np.maximum(table.first, table.last) * tied_s


def stage_memory(problem: Problem, table: StageTable) -> np.ndarray:
    """Bytes per device of each stage [3.5]."""
    return cost.stage_memory_bytes(problem.model, problem.training, stage_shapes(problem, table))


def breakdown(problem: Problem, table: StageTable) -> Breakdown:
    shape = stage_shapes(problem, table)
    compute, tp, tau, pp = stage_times(problem, table, shape)
    micro = table.batch // problem.training.micro_batch
    pipe_time, bubble = cost.pipeline_times(tau, pp, table.pipe_start[:-1], micro)
    dp = stage_dp_times(table, dp_layer_times(problem, table), tied_sync_time(problem, table))
    dp_time = float(dp.max())
    states = cost.stage_state_bytes(problem.model, problem.training, shape)
    activations = cost.stage_activation_bytes(problem.model, problem.training, shape)
    return Breakdown(
        compute=compute, tp=tp, tau=tau, pp=pp, dp=dp,
        memory=states + activations + reserve_bytes(problem.training), states=states, activations=activations,
        capacity=problem.cluster.machine_memory_bytes[table.machine],
        pipe_time=pipe_time, bubble=bubble,
        dp_time=dp_time, iteration=float(pipe_time.max()) + dp_time,
    )


def require_valid_structure(problem: Problem, plan: Plan) -> None:
    violations = structural_violations(problem, plan)
    if violations:
        raise InvalidPlanError(violations)


def iteration_time(problem: Problem, plan: Plan, check: bool = True) -> float:
    """T of docs/cost-model.md §3.6 only: the heuristic's inner loop."""
    if check:
        require_valid_structure(problem, plan)
    return breakdown(problem, stage_table(problem, plan)).iteration


