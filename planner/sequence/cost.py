"""The cost model of sequence plans: DESIGN.md §7.2–§7.3, term by term, as small pure functions.

Like `planner.cost` (whose collective primitives and multipliers these reuse), every function
works on Python scalars and numpy arrays alike, element-wise, so that the evaluator prices
every member of a plan in a few vector operations and a solver can take its coefficients
from the very same functions. Units: bytes, seconds, GB/s, FLOP/s. Per layer and per
micro-batch of b sequences unless a name says otherwise.
"""

from __future__ import annotations

import numpy as np

from planner.base import GB, GIB
from planner.cost import allreduce_time, bcast_time, pass_multiplier
from planner.workload import ModelSpec, TrainingSpec

# -- sizes ----------------------------------------------------------------------------------


def linear_params(model: ModelSpec) -> int:
    """P_layer − 2h: the parameters of a layer's matrices (norms excluded)."""
    return model.params_per_layer - 2 * model.hidden


def kv_heads_of(model: ModelSpec, heads):
    """kv_i = heads_i·k/a: the kv heads a member holds."""
    return heads * model.num_kv_heads / model.heads


def causal_pairs(seq_len, group_tokens):
    """pairs_g = ℓ_g·(s+1), ℓ_g = T_g/2: causal (query, key) pairs of a mirrored shard [7.1]."""
    return group_tokens / 2.0 * (seq_len + 1)


def a2a_rounds(training: TrainingSpec) -> int:
    """r_a2a: HP all-to-all pairs per layer, 3 with recompute, 2 without."""
    return 3 if training.recompute else 2


def ring_rounds(training: TrainingSpec) -> int:
    """ρ: CP ring passes per layer, 4 with recompute, 3 without."""
    return 4 if training.recompute else 3


# -- compute [7.2] --------------------------------------------------------------------------


def linear_compute_time(model, training, tokens, flops):
    """Clin_i = c·b·t_i·2·(P_layer − 2h) / π_i."""
    return pass_multiplier(training) * training.micro_batch * tokens * 2.0 * linear_params(model) / flops


def attention_compute_time(model, training, pairs, heads, flops):
    """Catt_i = c·b·4·h·pairs_g·(heads_i/a) / π_i."""
    c, b = pass_multiplier(training), training.micro_batch
    return c * b * 4.0 * model.hidden * pairs * (heads / model.heads) / flops


def head_compute_time(model, training, tokens, flops):
    """Chead_i = c·b·t_i·2·V·h / π_i (LM head, once per micro-batch)."""
    return pass_multiplier(training) * training.micro_batch * tokens * 2.0 * model.vocab * model.hidden / flops


# -- head parallelism: the Ulysses all-to-all [7.2] -----------------------------------------


def qkv_exchange_bytes(model, training, tokens, group_tokens, heads):
    """(sent_i, received_i) of the qkv exchange: b·t_i·(h+2kd)·β·(1 − heads_i/a) and
    b·(T_g − t_i)·(h+2kd)·β·heads_i/a."""
    width = training.micro_batch * (model.hidden + 2 * model.num_kv_heads * model.head_dim) * training.act_bytes
    share = heads / model.heads
    return width * tokens * (1.0 - share), width * (group_tokens - tokens) * share


def output_exchange_bytes(model, training, tokens, group_tokens, heads):
    """(sent_i, received_i) of the output exchange: b·(T_g − t_i)·heads_i·d·β and
    b·t_i·(a − heads_i)·d·β."""
    unit = training.micro_batch * model.head_dim * training.act_bytes
    return unit * (group_tokens - tokens) * heads, unit * tokens * (model.heads - heads)


def exchange_time(max_bytes, members, bw_gbps, lat_s):
    """One all-to-all: max_i max(sent_i, received_i)/(bw_g·1e9) + (n_g − 1)·α_g; 0 when n_g = 1."""
    members = np.asarray(members, dtype=float)
    return np.where(members > 1, max_bytes / (bw_gbps * GB) + (members - 1.0) * lat_s, 0.0)


# -- context parallelism: the K/V ring [7.2] -------------------------------------------------


def ring_time(model, training, group_tokens, kv_heads, ring_size, bw_gbps, lat_s):
    """ring_i = b·(s − T_g)·2·kv_i·d·β / (bw_{g−1,g}·1e9) + (G_r − 1)·lat_{g−1,g}; 0 when G_r = 1."""
    nbytes = training.micro_batch * (training.seq_len - group_tokens) * 2.0 * kv_heads * model.head_dim * training.act_bytes
    ring_size = np.asarray(ring_size, dtype=float)
    return np.where(ring_size > 1, nbytes / (bw_gbps * GB) + (ring_size - 1.0) * lat_s, 0.0)


def a2a_layer_time(training, a2a_max):
    """r_a2a·max_g a2a_g: a layer's HP all-to-alls, every pass."""
    return a2a_rounds(training) * a2a_max


def layer_time(training, linear_max, a2a_max, attention_max, ring_max):
    """T_layer = max_i Clin_i + r_a2a·max_g a2a_g + max(max_i Catt_i, ρ·T_ring)."""
    return linear_max + a2a_layer_time(training, a2a_max) + np.maximum(attention_max, ring_rounds(training) * ring_max)


def hp_micro_batch_time(model, training, a2a_max):
    """L·r_a2a·max_g a2a_g: the part of T_mb spent in HP all-to-alls."""
    return model.layers * a2a_layer_time(training, a2a_max)


# -- ZeRO-3 and data parallelism [7.2] ------------------------------------------------------


def allgather_time(n, nbytes, bw_gbps, lat_s):
    """ag(n, x) = (n−1)/n·x/(bw·1e9) + (n−1)·α, 0 when n = 1 (the cost of §3's bcast)."""
    return bcast_time(n, nbytes, bw_gbps, lat_s)


def zero_time(training, params, devices, bw_gbps, lat_s):
    """(c−1)·ag(N_r, P·β) + ag(N_r, P·γ): gathers of the weights, one reduce-scatter of the
    gradients; `params` is P_layer for Z_layer, P_emb + P_head for Z_ends."""
    gathers = (pass_multiplier(training) - 1) * allgather_time(devices, params * training.act_bytes, bw_gbps, lat_s)
    return gathers + allgather_time(devices, params * training.grad_bytes, bw_gbps, lat_s)


def end_params(model: ModelSpec) -> int:
    """P_emb + P_head: what Z_ends gathers."""
    return model.params_embedding + model.params_head


def zero_micro_batch_time(model, zero_layer_s, zero_ends_s):
    """L·Z_layer + Z_ends: the part of T_mb spent in ZeRO-3 gathers and scatters."""
    return model.layers * zero_layer_s + zero_ends_s


def micro_batch_time(model, layer_s, zero_layer_s, head_max, zero_ends_s):
    """T_mb(r) = L·(T_layer + Z_layer) + max_i Chead_i + Z_ends."""
    return model.layers * layer_s + head_max + zero_micro_batch_time(model, zero_layer_s, zero_ends_s)


def dp_time(model, training, replicas, min_devices, bw_gbps, lat_s):
    """T_dp = allreduce(D, P_total·γ / min_r N_r, bw_x, α_x); 0 when D = 1."""
    return allreduce_time(replicas, model.total_params * training.grad_bytes / min_devices, bw_gbps, lat_s)


def iteration_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """F_iter = 3·B·s·(L·2·(P_layer − 2h) + L·2·h·(s+1) + 2·V·h)."""
    s, L = training.seq_len, model.layers
    per_token = L * 2.0 * linear_params(model) + L * 2.0 * model.hidden * (s + 1) + 2.0 * model.vocab * model.hidden
    return 3.0 * training.global_batch * s * per_token


# -- memory per device [7.3] ----------------------------------------------------------------


def state_bytes(model, training, devices):
    """μ·P_total / N_r: the device's ZeRO-3 shard of weights, gradients and optimizer state."""
    return training.param_state_bytes * model.total_params / devices


def gathered_bytes(model, training) -> float:
    """2·β·max(P_layer, P_head): the gathered weights of one layer (or the head), double-buffered."""
    return 2.0 * training.act_bytes * max(model.params_per_layer, model.params_head)


def working_set_bytes(model, training, tokens, group_tokens, heads):
    """a_full_i = b·h·(26·t_i + 8·T_g·heads_i/a): one layer's working set."""
    return training.micro_batch * model.hidden * (26.0 * tokens + 8.0 * group_tokens * heads / model.heads)


def activation_bytes(model, training, tokens, working_set):
    """L·2·b·t_i·h + a_full_i with recompute, L·a_full_i without."""
    if training.recompute:
        return model.layers * 2.0 * training.micro_batch * tokens * model.hidden + working_set
    return model.layers * working_set


def ring_buffer_bytes(model, training, max_group_tokens, kv_heads, ring_size):
    """2·b·T_max·2·kv_i·d·β; 0 when G_r = 1."""
    nbytes = 2.0 * training.micro_batch * max_group_tokens * 2.0 * kv_heads * model.head_dim * training.act_bytes
    return np.where(np.asarray(ring_size) > 1, nbytes, 0.0)


def logits_bytes(model, training, tokens):
    """4·b·t_i·V."""
    return 4.0 * training.micro_batch * tokens * model.vocab


def reserve_bytes(training) -> float:
    """R·2^30."""
    return training.reserved_gib * GIB
