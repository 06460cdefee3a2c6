"""The cost model of layered plans (docs/cost-model.md §3), term by term, as small pure functions.

A stage is read through one typed record, `StageShape` (its machine's figures, t, n, whether it
holds the embedding or the head, its in-flight micro-batches and the plan's D), so that a new
dimension of the model changes that record and the functions that read it, not every caller.
Every field may be a scalar or a numpy array (one entry per stage): the evaluator prices every
stage of a plan in a few vector operations, and the exact solvers take their coefficients from
the very same functions. The primitives both plan kinds share live in `planner.cost`.
Units: bytes, seconds, GB/s, FLOP/s; labels such as [3.1] are the sections of the docs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner import cost
from planner.schedules import get_schedule
from planner.workload import ModelSpec, TrainingSpec

ArrayLike = Any  # a Python number or a numpy array of one entry per stage


@dataclass(frozen=True)
class StageShape:
    """One stage, or many stages element-wise: what §3.1–§3.5 read of it."""

    tp: ArrayLike  # t, devices of its tensor-parallel group
    layers: ArrayLike  # n
    first: ArrayLike = 0  # 1 if it holds the embedding
    last: ArrayLike = 0  # 1 if it holds the LM head
    flops: ArrayLike = 1.0  # π_σ = peak·η of its GPU type, FLOP/s
    attention_flops: ArrayLike = 1.0  # π_att,σ = peak·η_att
    bw_gbps: ArrayLike = 1.0  # bw_σ, its machine's intra bandwidth
    lat_s: ArrayLike = 0.0  # α_σ, its machine's intra latency
    in_flight: ArrayLike = 1  # q of §3.5 (memory only)
    pipelines: int = 1  # D of the plan (ZeRO-1 memory only)

    @classmethod
    def on(cls, cluster, machine, tp, layers, **fields) -> StageShape:
        """A stage (or stages) on machine index `machine` of `cluster`: its figures read off it."""
        return cls(tp=tp, layers=layers, flops=cluster.machine_flops[machine],
                   attention_flops=cluster.machine_attention_flops[machine],
                   bw_gbps=cluster.machine_intra_bw[machine], lat_s=cluster.machine_intra_lat[machine], **fields)

    def with_(self, **fields) -> StageShape:
        """The same stage with some fields changed (e.g. another layer count)."""
        return replace(self, **fields)


# -- sizes --------------------------------------------------------------------------------


def activation_message_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """A = b·s·h·β: one micro-batch's activation (or its gradient) between stages."""
    return training.micro_batch * training.seq_len * model.hidden * training.act_bytes


def tp_rounds(training: TrainingSpec) -> int:
    """r: TP all-reduces per layer per micro-batch = 6 with recompute, else 4."""
    return 6 if training.recompute else 4


# -- stage time per micro-batch [3.1] -----------------------------------------------------


def stage_compute_time(model: ModelSpec, training: TrainingSpec, stage: StageShape):
    """C_σ = c·b·s·(n·(F_mm/π_σ + F_att/π_att,σ) + [last]·F_head/π_σ) / t."""
    per_layer = (cost.matrix_flops_per_token(model) / stage.flops
                 + cost.attention_flops_per_token(model, training.seq_len) / stage.attention_flops)
    seconds_per_token = stage.layers * per_layer + stage.last * cost.head_flops_per_token(model) / stage.flops
    tokens = training.micro_batch * training.seq_len
    return cost.pass_multiplier(training) * tokens * seconds_per_token / stage.tp


def stage_tp_time(model: ModelSpec, training: TrainingSpec, stage: StageShape):
    """T_tp,σ = n·r·allreduce(t, A, bw_σ, α_σ) (with sequence parallelism each all-reduce is a
    reduce-scatter and an all-gather of the same volume: the same time)."""
    a = activation_message_bytes(model, training)
    return stage.layers * tp_rounds(training) * cost.allreduce_time(stage.tp, a, stage.bw_gbps, stage.lat_s)


def stage_time_parts(model: ModelSpec, training: TrainingSpec, stage: StageShape):
    """(C_σ, T_tp,σ, τ_σ = C_σ + T_tp,σ): one micro-batch's forward and backward on the stage."""
    compute = stage_compute_time(model, training, stage)
    tp = stage_tp_time(model, training, stage)
    return compute, tp, compute + tp


def stage_time(model: ModelSpec, training: TrainingSpec, stage: StageShape):
    """τ_σ alone (see `stage_time_parts`)."""
    return stage_time_parts(model, training, stage)[2]


# -- pipeline-parallel traffic [3.2] ------------------------------------------------------


def stage_pp_time(model, training, *, link_bw_gbps, link_lat_s, t_next, bw_next_gbps, lat_next_s):
    """T_pp,k = 2·(p2p(A, bw(k,k+1), lat(k,k+1)) + bcast(t_{k+1}, A, bw_{k+1}, α_{k+1}))."""
    a = activation_message_bytes(model, training)
    return 2.0 * (cost.p2p_time(a, link_bw_gbps, link_lat_s)
                  + cost.bcast_time(t_next, a, bw_next_gbps, lat_next_s))


# -- pipeline time, 1F1B [3.3] ------------------------------------------------------------


def pipeline_time(tau, pp, micro_batches):
    """T_pipe = Σ τ_k + Σ_{k<S} T_pp,k + (m−1)·max_k max(τ_k, T_pp,k).

    `tau` and `pp` are one pipeline's per-stage arrays (pp of the last stage is 0)."""
    tau, pp = np.asarray(tau, dtype=float), np.asarray(pp, dtype=float)
    return float(tau.sum() + pp.sum() + (micro_batches - 1) * np.maximum(tau, pp).max())


def pipeline_times(tau, pp, starts, micro_batches):
    """T_pipe of every pipeline of a stage table at once, and its fill-and-drain part Σ τ + Σ T_pp;
    `starts` are the pipelines' first stages, `micro_batches` their m_p."""
    bubble = np.add.reduceat(tau + pp, starts)
    steady = np.maximum.reduceat(np.maximum(tau, pp), starts)
    return bubble + (micro_batches - 1) * steady, bubble


# -- data-parallel gradient sync [3.4], ZeRO-1 [11] ---------------------------------------


def dp_layer_time(pipelines, params, training, t_min, bw_min_gbps, lat_max_s):
    """τ_dp(ℓ) = allreduce(D, P(ℓ)·γ / t_min(ℓ), bw_min(ℓ), α_max(ℓ)); under ZeRO-1 (D ≥ 2)
    rs(D, P(ℓ)·γ/t_min) + ag(D, P(ℓ)·μ_w/t_min): the D holders reduce-scatter the gradient,
    each updates its 1/D, and they all-gather the updated weights [11]."""
    shard = params / t_min
    if training.zero_stage == 1:
        return (cost.reduce_scatter_time(pipelines, shard * training.grad_bytes, bw_min_gbps, lat_max_s)
                + cost.allgather_time(pipelines, shard * training.weight_bytes, bw_min_gbps, lat_max_s))
    return cost.allreduce_time(pipelines, shard * training.grad_bytes, bw_min_gbps, lat_max_s)


def tied_sync_time(model, training, holders, t_min, bw_min_gbps, lat_max_s):
    """τ_dp of the tied embedding: allreduce(n, P_emb·γ/t_min, bw_min, α_max) over its n holder
    stages (the first and the last of every pipeline; one where S = 1), priced even when D = 1:
    a pipeline of several stages keeps two copies whose gradients are summed [3.4]."""
    return cost.allreduce_time(holders, model.params_embedding * training.grad_bytes / t_min,
                               bw_min_gbps, lat_max_s)


# -- memory per device [3.5] --------------------------------------------------------------


def state_bytes_per_param(training: TrainingSpec, pipelines) -> float:
    """μ_σ: μ, or μ − μ_o + μ_o/D with ZeRO-1 over D ≥ 2 pipelines [11]."""
    pipelines = np.asarray(pipelines)
    sharded = training.param_state_bytes - training.optimizer_bytes + training.optimizer_bytes / np.maximum(pipelines, 1)
    use = (training.zero_stage == 1) & (pipelines >= 2)
    return np.where(use, sharded, training.param_state_bytes)


def stage_params(model: ModelSpec, stage: StageShape):
    """n·P_layer + [first]·P_emb + [last]·P_head: the parameters the stage holds (all t shards)."""
    return stage.layers * model.params_per_layer + stage.first * model.params_embedding + stage.last * model.params_head


def stage_state_bytes(model: ModelSpec, training: TrainingSpec, stage: StageShape):
    """W_σ = μ_σ·(n·P_layer + [first]·P_emb + [last]·P_head) / t."""
    return state_bytes_per_param(training, stage.pipelines) * stage_params(model, stage) / stage.tp


def layer_activation_bytes(model: ModelSpec, training: TrainingSpec, tp):
    """(a_full, a_ckpt) of one layer and micro-batch: s·b·h·(10 + 24/t) and 2·s·b·h (flash attention);
    with sequence parallelism 34·s·b·h/t and 2·s·b·h/t (norms, residuals, kept input split too)."""
    sbh = training.seq_len * training.micro_batch * model.hidden
    if training.sequence_parallel:
        return 34.0 * sbh / tp, 2.0 * sbh / tp
    return sbh * (10.0 + 24.0 / tp), 2.0 * sbh


def stage_activation_bytes(model: ModelSpec, training: TrainingSpec, stage: StageShape):
    """Act_σ = q·n·(a_ckpt | a_full) + [recompute]·a_full + [last]·4·b·s·V/t."""
    a_full, a_ckpt = layer_activation_bytes(model, training, stage.tp)
    kept = a_ckpt if training.recompute else a_full
    logits = stage.last * cost.logits_bytes(model, training, training.seq_len, stage.tp)
    return stage.in_flight * stage.layers * kept + (a_full if training.recompute else 0.0) + logits


def in_flight_micro_batches(training, num_stages, index, micro_batches):
    """q: micro-batches whose activations stage k holds at once under the training's schedule
    (1F1B: min(S − k, m_p); GPipe: m_p) — the schedule's own `in_flight`."""
    return get_schedule(training.schedule).in_flight(num_stages, index, micro_batches)


def stage_memory_bytes(model: ModelSpec, training: TrainingSpec, stage: StageShape):
    """W_σ + Act_σ + R·2^30: what one device of the stage needs."""
    return (stage_state_bytes(model, training, stage) + stage_activation_bytes(model, training, stage)
            + cost.reserve_bytes(training))


def max_layers_fitting(model: ModelSpec, training: TrainingSpec, stage: StageShape, capacity_bytes):
    """The most layers n ≤ L a stage can hold within its device memory (the §3.5 bound, with the
    validator's own comparison), element-wise over stages; 0 when not even one layer fits.

    Memory grows with n, so the count of n in 1..L that fit is the largest one that fits."""
    n = np.arange(1, model.layers + 1)
    shape = np.broadcast(stage.tp, stage.first, stage.last, stage.in_flight, capacity_bytes).shape
    expand = (lambda x: np.asarray(x)[..., None]) if shape else (lambda x: x)
    probe = stage.with_(tp=expand(stage.tp), layers=n, first=expand(stage.first), last=expand(stage.last),
                        in_flight=expand(stage.in_flight))
    return (stage_memory_bytes(model, training, probe) <= expand(capacity_bytes)).sum(axis=-1)


def model_state_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """μ·(L·P_layer + P_emb + P_head): the model states of one whole replica."""
    return float(training.param_state_bytes * model.total_params)


def replicas_fitting(model: ModelSpec, training: TrainingSpec, usable_bytes: float) -> int:
    """The most pipelines D whose model states fit in `usable_bytes` in all: D·μ·P, or with
    ZeRO-1 (D ≥ 2) D·(μ − μ_o)·P + μ_o·P, the optimizer state held once across the D [11]."""
    whole = training.param_state_bytes * model.total_params
    plain = int(usable_bytes // whole)
    kept = (training.param_state_bytes - training.optimizer_bytes) * model.total_params
    if training.zero_stage != 1 or kept <= 0:
        return plain
    sharded = int((usable_bytes - training.optimizer_bytes * model.total_params) // kept)
    return sharded if sharded >= 2 else plain
