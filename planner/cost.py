"""What both plan kinds' cost models share (docs/cost-model.md §3, docs/sequence-plans.md §7.2):
the collective primitives, the FLOPs of a token, the pass multiplier, and the bytes every
device holds whatever its plan (logits, the reserve).

Each term is written once, here; `planner.layered.cost` (§3) and `planner.sequence.cost` (§7)
build their stage and member terms from them. Every function works on Python scalars and on
numpy arrays alike (element-wise). Units: bytes, seconds, GB/s, FLOP/s.
"""

from __future__ import annotations

import numpy as np

from planner.base import GB, GIB
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


def allgather_time(n, nbytes, bw_gbps, lat_s):
    """ag(n, x) = (n−1)/n·x/(bw·1e9) + (n−1)·α, 0 when n ≤ 1: a ring all-gather of x bytes in
    all, the same steps and bytes as a broadcast's (and as a reduce-scatter's, `rs`)."""
    return bcast_time(n, nbytes, bw_gbps, lat_s)


def reduce_scatter_time(n, nbytes, bw_gbps, lat_s):
    """rs(n, x) = ag(n, x): half of an all-reduce [11]."""
    return allgather_time(n, nbytes, bw_gbps, lat_s)


def alltoall_time(n, max_bytes, bw_gbps, lat_s):
    """One all-to-all of n members: max_i max(sent_i, received_i)/(bw·1e9) + (n − 1)·α; 0 when n ≤ 1."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, max_bytes / (bw_gbps * GB) + (n - 1.0) * lat_s, 0.0)


# -- FLOPs of one token, forward [3] --------------------------------------------------------


def matrix_flops_per_token(model: ModelSpec) -> float:
    """F_mm = 2·P_mm: a layer's matrix multiplications (biases and norms are not GEMM work)."""
    return 2.0 * model.matrix_params


def attention_flops_per_token(model: ModelSpec, seq_len) -> float:
    """F_att = 2·h·(s+1): causal attention, a token meets (s+1)/2 keys on average, and each
    (query, key) pair costs 2·d FLOPs for the score and 2·d for the weighted value, over a heads."""
    return 2.0 * model.hidden * (seq_len + 1.0)


def head_flops_per_token(model: ModelSpec) -> float:
    """F_head = 2·V·h."""
    return 2.0 * model.vocab * model.hidden


def layer_flops_per_token(model: ModelSpec, seq_len) -> float:
    """F_layer = F_mm + F_att."""
    return matrix_flops_per_token(model) + attention_flops_per_token(model, seq_len)


def pass_multiplier(training: TrainingSpec) -> int:
    """c: forward + backward (+ recomputed forward) = 4 with recompute, else 3."""
    return 4 if training.recompute else 3


def iteration_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """F_iter = 3·B·s·(L·F_layer + F_head): model FLOPs of one iteration, the same count for
    both plan kinds (no recomputation: it is work the plan adds, not the model's) [3.6, 7.2]."""
    per_token = model.layers * layer_flops_per_token(model, training.seq_len) + head_flops_per_token(model)
    return 3.0 * training.global_batch * training.seq_len * per_token


def tokens_per_second(training: TrainingSpec, iteration_s: float) -> float:
    """B·s / T: the tokens one iteration trains, per second of it [3.6]."""
    return training.global_batch * training.seq_len / iteration_s


def model_flops_utilization(model: ModelSpec, training: TrainingSpec, iteration_s: float, peak_flops: float) -> float:
    """MFU = F_iter / (T · Σ peak): the model's FLOPs against every device's peak [3.6, 7.2]."""
    return iteration_flops(model, training) / (iteration_s * peak_flops)


# -- bytes every device holds ---------------------------------------------------------------


def logits_bytes(model: ModelSpec, training: TrainingSpec, tokens, shards=1):
    """4·b·tokens·V/shards: the fp32 logits of `tokens` tokens per sequence, split over `shards`
    devices (a TP stage splits the vocabulary; a sequence member holds its own tokens whole)."""
    return 4.0 * training.micro_batch * tokens * model.vocab / shards


def reserve_bytes(training: TrainingSpec) -> float:
    """R·2^30: the per-device runtime reserve (CUDA context, allocator slack)."""
    return training.reserved_gib * GIB


def machine_usable_bytes(cluster, training) -> np.ndarray:
    """Per machine, count × max(0, memory − R): what model states may fill there. A device with
    less memory than the reserve adds nothing, not less than nothing (a negative share had made a
    cluster, or a machine set holding that device, fail the states test its other devices pass)."""
    return np.maximum(cluster.machine_memory_bytes - reserve_bytes(training), 0.0) * cluster.machine_counts


def usable_memory_bytes(cluster, training) -> float:
    """The cluster's device memory past the per-device reserve R: what model states may fill."""
    return float(np.sum(machine_usable_bytes(cluster, training)))
