"""The one cost model: DESIGN.md §3, term by term, as small pure functions.

Every function works on Python scalars and on numpy arrays alike (element-wise), so the
evaluator prices all stages of a plan in a few vector operations, and the exact solvers
take their coefficients from the very same functions. Units: bytes, seconds, GB/s, FLOP/s.
Labels such as [3.1] refer to the sections of DESIGN.md.
"""

from __future__ import annotations

import numpy as np

from planner.base import GB, GIB
from planner.schedules import get_schedule
from planner.workload import ModelSpec, TrainingSpec

# -- collective primitives [3] ------------------------------------------------------------


def p2p_time(nbytes, bw_gbps, lat_s):
    """p2p(x, bw, α) = x/(bw·1e9) + α."""
    return nbytes / (bw_gbps * GB) + lat_s


def allreduce_time(n, nbytes, bw_gbps, lat_s):
    """allreduce(n, x, bw, α) = 2(n−1)/n · x/(bw·1e9) + 2(n−1)·α, 0 when n ≤ 1."""
    n = np.asarray(n, dtype=float)
    steps = np.maximum(n - 1.0, 0.0)
    return 2.0 * steps / np.maximum(n, 1.0) * nbytes / (bw_gbps * GB) + 2.0 * steps * lat_s


def bcast_time(n, nbytes, bw_gbps, lat_s):
    """bcast(n, x, bw, α) = (n−1)/n · x/(bw·1e9) + (n−1)·α, 0 when n ≤ 1."""
    n = np.asarray(n, dtype=float)
    steps = np.maximum(n - 1.0, 0.0)
    return steps / np.maximum(n, 1.0) * nbytes / (bw_gbps * GB) + steps * lat_s


# -- sizes derived from the model and the training settings -------------------------------


def activation_message_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """A = b·s·h·β: one micro-batch's activation (or its gradient) between stages."""
    return training.micro_batch * training.seq_len * model.hidden * training.act_bytes


def layer_flops_per_token(model: ModelSpec, training: TrainingSpec) -> float:
    """F_layer = 2·(P_layer − 2h) + 4·s·h, forward FLOPs per token of one layer."""
    return 2.0 * (model.params_per_layer - 2 * model.hidden) + 4.0 * training.seq_len * model.hidden


def head_flops_per_token(model: ModelSpec) -> float:
    """F_head = 2·V·h."""
    return 2.0 * model.vocab * model.hidden


def pass_multiplier(training: TrainingSpec) -> int:
    """c: forward + backward (+ recomputed forward) = 4 with recompute, else 3."""
    return 4 if training.recompute else 3


def tp_rounds(training: TrainingSpec) -> int:
    """r: TP all-reduces per layer per micro-batch = 6 with recompute, else 4."""
    return 6 if training.recompute else 4


def iteration_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """F_iter = 3·B·s·(L·F_layer + F_head), model FLOPs of one iteration [3.6]."""
    per_token = model.layers * layer_flops_per_token(model, training) + head_flops_per_token(model)
    return 3.0 * training.global_batch * training.seq_len * per_token


# -- stage time per micro-batch [3.1] -----------------------------------------------------


def stage_compute_time(model, training, flops_per_device, t, n, last):
    """C_σ = c·b·s·(n·F_layer + [last]·F_head) / (t·π)   (π in FLOP/s)."""
    flops = n * layer_flops_per_token(model, training) + last * head_flops_per_token(model)
    tokens = training.micro_batch * training.seq_len
    return pass_multiplier(training) * tokens * flops / (t * flops_per_device)


def stage_tp_time(model, training, t, n, bw_gbps, lat_s):
    """T_tp,σ = n·r·allreduce(t, A, bw_σ, α_σ)."""
    a = activation_message_bytes(model, training)
    return n * tp_rounds(training) * allreduce_time(t, a, bw_gbps, lat_s)


def stage_time_parts(model, training, flops_per_device, t, n, last, bw_gbps, lat_s):
    """(C_σ, T_tp,σ, τ_σ = C_σ + T_tp,σ): one micro-batch's forward and backward on the stage."""
    compute = stage_compute_time(model, training, flops_per_device, t, n, last)
    tp = stage_tp_time(model, training, t, n, bw_gbps, lat_s)
    return compute, tp, compute + tp


def stage_time(model, training, flops_per_device, t, n, last, bw_gbps, lat_s):
    """τ_σ alone (see `stage_time_parts`)."""
    return stage_time_parts(model, training, flops_per_device, t, n, last, bw_gbps, lat_s)[2]


# -- pipeline-parallel traffic [3.2] ------------------------------------------------------


def stage_pp_time(model, training, *, link_bw_gbps, link_lat_s, t_next, bw_next_gbps, lat_next_s):
    """T_pp,k = 2·(p2p(A, bw(k,k+1), lat(k,k+1)) + bcast(t_{k+1}, A, bw_{k+1}, α_{k+1}))."""
    a = activation_message_bytes(model, training)
    return 2.0 * (
        p2p_time(a, link_bw_gbps, link_lat_s) + bcast_time(t_next, a, bw_next_gbps, lat_next_s)
    )


# -- pipeline time, 1F1B [3.3] ------------------------------------------------------------


def pipeline_time(tau, pp, micro_batches):
    """T_pipe = Σ τ_k + Σ_{k<S} T_pp,k + (m−1)·max_k max(τ_k, T_pp,k).

    `tau` and `pp` are one pipeline's per-stage arrays (pp of the last stage is 0)."""
    tau, pp = np.asarray(tau, dtype=float), np.asarray(pp, dtype=float)
    return float(tau.sum() + pp.sum() + (micro_batches - 1) * np.maximum(tau, pp).max())


# -- data-parallel gradient sync [3.4] ----------------------------------------------------


def dp_layer_time(pipelines, params, training, t_min, bw_min_gbps, lat_max_s):
    """τ_dp(ℓ) = allreduce(D, P(ℓ)·γ / t_min(ℓ), bw_min(ℓ), α_max(ℓ))."""
    return allreduce_time(pipelines, params * training.grad_bytes / t_min, bw_min_gbps, lat_max_s)


def holders_bw_lat(machines, bw_matrix, lat_matrix):
    """bw_min and α_max over all pairs of holders (one per pipeline) of one layer.

    Two holders on one machine communicate at that machine's intra values (the diagonal);
    a machine that holds the layer for a single pipeline contributes no diagonal pair."""
    machines = np.asarray(machines)
    uniq, counts = np.unique(machines, return_counts=True)
    sub_bw = bw_matrix[np.ix_(uniq, uniq)].copy()
    sub_lat = lat_matrix[np.ix_(uniq, uniq)].copy()
    single = np.flatnonzero(counts < 2)
    sub_bw[single, single] = np.inf
    sub_lat[single, single] = -np.inf
    return float(sub_bw.min()), float(sub_lat.max())


def holders_bw_lat_rows(machines, bw_matrix, lat_matrix, block_elements: int = 1 << 13,
                        max_elements: int = 1 << 22):
    """`holders_bw_lat` for many layers at once: `machines` is (layers, D), one holder per
    pipeline in each row; returns (bw_min, α_max) arrays of length `layers`.

    Pairs (i, j), i ≠ j, of a row give bw[m_i, m_j]: two holders on one machine read that
    machine's intra value off the diagonal, exactly as in `holders_bw_lat`. Rows are taken
    a few at a time (about `block_elements` pairs): small temporaries are reused by the
    allocator, while large ones cost a fresh mapping and its page faults on every call."""
    machines = np.asarray(machines)
    rows, d = machines.shape
    bw_min, lat_max = np.empty(rows), np.empty(rows)
    chunk = max(1, block_elements // (d * d))
    if d * d > max_elements:  # thousands of pipelines: one row at a time on its distinct machines
        for r in range(rows):
            bw_min[r], lat_max[r] = holders_bw_lat(machines[r], bw_matrix, lat_matrix)
        return bw_min, lat_max
    n = bw_matrix.shape[0]
    flat_bw, flat_lat = bw_matrix.ravel(), lat_matrix.ravel()
    for start in range(0, rows, chunk):
        block = machines[start: start + chunk]
        pairs = (block[:, :, None] * n + block[:, None, :]).reshape(len(block), d * d)
        bw = np.take(flat_bw, pairs)
        bw[:, :: d + 1] = np.inf  # i = j is not a pair
        lat = np.take(flat_lat, pairs)
        lat[:, :: d + 1] = -np.inf
        bw_min[start: start + chunk], lat_max[start: start + chunk] = bw.min(axis=1), lat.max(axis=1)
    return bw_min, lat_max


def cluster_holders_bw_lat(cluster, machines, pair_budget: int = 1 << 16):
    """bw_min and α_max [3.4] of each row of holders (layers, D) on `cluster`, whatever its size.

    Small clusters read the dense matrices (`holders_bw_lat_rows`). Large ones read the sparse
    link tables: every pair looked up while there are few (≤ `pair_budget`), else each row's
    extremes from the tables' structure (`PairTable.row_extremes`), never forming D² pairs."""
    machines = np.asarray(machines)
    if cluster.dense_lookup:
        return holders_bw_lat_rows(machines, cluster.bw_matrix, cluster.lat_matrix)
    rows, d = machines.shape
    if rows * d * d <= pair_budget:
        a, b = machines[:, :, None], machines[:, None, :]
        diagonal = np.arange(d)
        bw, lat = cluster.bw_table(a, b), cluster.lat_table(a, b)
        bw[:, diagonal, diagonal], lat[:, diagonal, diagonal] = np.inf, -np.inf  # i = j is not a pair
        return bw.min(axis=(1, 2)), lat.max(axis=(1, 2))
    bw_min = np.array([cluster.bw_table.row_extremes(row, use_max=False) for row in machines])
    lat_max = np.array([cluster.lat_table.row_extremes(row, use_max=True) for row in machines])
    return bw_min, lat_max


# -- memory per device [3.5] --------------------------------------------------------------


def stage_state_bytes(model, training, t, n, first, last):
    """W_σ = μ·(n·P_layer + [first]·P_emb + [last]·P_head) / t."""
    params = n * model.params_per_layer + first * model.params_embedding + last * model.params_head
    return training.param_state_bytes * params / t


def in_flight_micro_batches(training, num_stages, index, micro_batches):
    """q: micro-batches whose activations stage k holds at once under the training's schedule
    (1F1B: min(S − k, m_p); GPipe: m_p) — the schedule's own `in_flight`."""
    return get_schedule(training.schedule).in_flight(num_stages, index, micro_batches)


def stage_activation_bytes(model, training, t, n, in_flight, last):
    """Act_σ = q·n·(a_ckpt | a_full) + [recompute]·a_full + [last]·4·b·s·V/t."""
    sbh = training.seq_len * training.micro_batch * model.hidden
    a_full = sbh * (10.0 + 24.0 / t)
    kept = 2.0 * sbh if training.recompute else a_full
    logits = last * 4.0 * training.micro_batch * training.seq_len * model.vocab / t
    return in_flight * n * kept + (a_full if training.recompute else 0.0) + logits


def stage_memory_bytes(model, training, t, n, first, last, in_flight):
    """W_σ + Act_σ + R·2^30: what one device of the stage needs."""
    return (
        stage_state_bytes(model, training, t, n, first, last)
        + stage_activation_bytes(model, training, t, n, in_flight, last)
        + training.reserved_gib * GIB
    )


def max_layers_fitting(model, training, t, first, last, in_flight, capacity_bytes):
    """The most layers n ≤ L a stage can hold within its device memory (the §3.5 bound, with the
    validator's own comparison), element-wise over stages; 0 when not even one layer fits.

    Memory grows with n, so the count of n in 1..L that fit is the largest one that fits."""
    n = np.arange(1, model.layers + 1)
    shape = np.broadcast(t, first, last, in_flight, capacity_bytes).shape
    expand = (lambda x: np.asarray(x)[..., None]) if shape else (lambda x: x)
    need = stage_memory_bytes(model, training, expand(t), n, expand(first), expand(last),
                              expand(in_flight))
    return (need <= expand(capacity_bytes)).sum(axis=-1)


def model_state_bytes(model, training) -> float:
    """μ·(L·P_layer + P_emb + P_head): the model states of one whole replica."""
    return float(stage_state_bytes(model, training, 1, model.layers, 1, 1))


def usable_memory_bytes(cluster, training) -> float:
    """The cluster's device memory past the per-device reserve R: what model states may fill."""
    reserve = training.reserved_gib * GIB
    return float(np.sum((cluster.machine_memory_bytes - reserve) * cluster.machine_counts))
