"""The cost model of sequence plans: docs/sequence-plans.md §7.2–§7.3, term by term, as small
pure functions.

Like `planner.layered.cost`, these build on the primitives both kinds share (`planner.cost`:
collectives, FLOPs per token, logits, reserve); every function
works on Python scalars and numpy arrays alike, element-wise, so that the evaluator prices
every member of a plan in a few vector operations and a solver can take its coefficients
from the very same functions. Units: bytes, seconds, GB/s, FLOP/s. Per layer and per
micro-batch of b sequences unless a name says otherwise.
"""

from __future__ import annotations

import numpy as np

from planner import cost
from planner.cost import (allgather_time, allreduce_time, alltoall_time, iteration_flops,  # noqa: F401 (re-exported)
                          pass_multiplier, reserve_bytes)
from planner.workload import ModelSpec, TrainingSpec

# -- sizes ----------------------------------------------------------------------------------


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
    """Clin_i = c·b·t_i·F_mm / π_i, F_mm = 2·P_mm."""
    return pass_multiplier(training) * training.micro_batch * tokens * cost.matrix_flops_per_token(model) / flops


def attention_compute_time(model, training, pairs, heads, attention_flops):
    """Catt_i = c·b·4·h·pairs_g·(heads_i/a) / π_att,i."""
    c, b = pass_multiplier(training), training.micro_batch
    return c * b * 4.0 * model.hidden * pairs * (heads / model.heads) / attention_flops


def head_compute_time(model, training, tokens, flops):
    """Chead_i = c·b·t_i·F_head / π_i (LM head, once per micro-batch)."""
    return pass_multiplier(training) * training.micro_batch * tokens * cost.head_flops_per_token(model) / flops


# -- head parallelism: the Ulysses all-to-all [7.2] -----------------------------------------


def qkv_exchange_bytes(model, training, tokens, group_tokens, heads):
    """(sent_i, received_i) of the qkv exchange: b·t_i·(h+2kd)·β·(1 − heads_i/a) and
    b·(T_g − t_i)·(h+2kd)·β·heads_i/a."""
    width = training.micro_batch * model.qkv_width * training.act_bytes
    share = heads / model.heads
    return width * tokens * (1.0 - share), width * (group_tokens - tokens) * share


def output_exchange_bytes(model, training, tokens, group_tokens, heads):
    """(sent_i, received_i) of the output exchange: b·(T_g − t_i)·heads_i·d·β and
    b·t_i·(a − heads_i)·d·β."""
    unit = training.micro_batch * model.head_dim * training.act_bytes
    return unit * (group_tokens - tokens) * heads, unit * tokens * (model.heads - heads)


def exchange_time(max_bytes, members, bw_gbps, lat_s):
    """One all-to-all of the group: `planner.cost.alltoall_time` over its n_g members."""
    return alltoall_time(members, max_bytes, bw_gbps, lat_s)


# -- context parallelism: the K/V ring [7.2] -------------------------------------------------


def ring_time(model, training, group_tokens, kv_heads, ring_size, bw_gbps, lat_s):
    """ring_i = b·(s − T_g)·2·kv_i·d·β / (bw_{g−1,g}·1e9) + (G_r − 1)·lat_{g−1,g}; 0 when G_r = 1."""
    nbytes = training.micro_batch * (training.seq_len - group_tokens) * 2.0 * kv_heads * model.head_dim * training.act_bytes
    ring_size = np.asarray(ring_size, dtype=float)
    return np.where(ring_size > 1, cost.p2p_time(nbytes, bw_gbps, (ring_size - 1.0) * lat_s), 0.0)


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
    """4·b·t_i·V: the member's own tokens' logits, whole (`planner.cost.logits_bytes`)."""
    return cost.logits_bytes(model, training, tokens)
