"""Every term of docs/sequence-plans.md §7.2 and §7.3 for a whole sequence plan, as numpy arrays over its
members, groups and replicas. The formulas are those of `planner.sequence.cost`; this module
only gathers each term's inputs (speeds, link figures, group and ring sizes) and takes the
maxima the cost model asks for. `iteration_time` is the solvers' fast path."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.problem import Problem
from planner.sequence import cost
from planner.sequence.links import Units, across_sets, between_sets, within_sets
from planner.sequence.plan import SeqPlan
from planner.sequence.rules import structural_violations
from planner.sequence.table import MemberTable
from planner.violations import InvalidPlanError


@dataclass(frozen=True, eq=False)
class TimeParts:
    """§7.2: per member (M,), per group (G,), per replica (D,) and the iteration."""

    machine: np.ndarray  # (M,) machine of each member
    linear: np.ndarray  # (M,) Clin_i
    attention: np.ndarray  # (M,) Catt_i
    head: np.ndarray  # (M,) Chead_i
    ring: np.ndarray  # (M,) ring_i
    pairs: np.ndarray  # (G,) pairs_g
    hp_bw: np.ndarray  # (G,) bw_g, GB/s (inf for one member)
    hp_lat: np.ndarray  # (G,) α_g, s
    a2a_qkv: np.ndarray  # (G,) the qkv exchange
    a2a_out: np.ndarray  # (G,) the output exchange
    ring_bw: np.ndarray  # (G,) bw_{g−1,g}
    ring_lat: np.ndarray  # (G,) lat_{g−1,g}
    group_ring: np.ndarray  # (G,) max ring_i over the group's members
    layer: np.ndarray  # (D,) T_layer
    linear_max: np.ndarray  # (D,) max_i Clin_i
    a2a_max: np.ndarray  # (D,) max_g a2a_g
    attention_max: np.ndarray  # (D,) max_i Catt_i
    ring_max: np.ndarray  # (D,) T_ring
    head_max: np.ndarray  # (D,) max_i Chead_i
    replica_bw: np.ndarray  # (D,) bw_r of ZeRO-3
    replica_lat: np.ndarray  # (D,) α_r
    zero_layer: np.ndarray  # (D,) Z_layer
    zero_ends: np.ndarray  # (D,) Z_ends
    hp_micro: np.ndarray  # (D,) L·r_a2a·max_g a2a_g: T_mb's HP all-to-alls
    zero_micro: np.ndarray  # (D,) L·Z_layer + Z_ends: T_mb's ZeRO-3 collectives
    micro_batch: np.ndarray  # (D,) T_mb
    micro_batches: np.ndarray  # (D,) m_r
    replica_time: np.ndarray  # (D,) T_rep = m_r·T_mb
    dp_bw: float
    dp_lat: float
    dp: float  # T_dp
    iteration: float  # T


def _per_group(values: np.ndarray, table: MemberTable, ufunc=np.maximum) -> np.ndarray:
    return ufunc.reduceat(values, table.group_start[:-1])


def _per_replica(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.maximum.reduceat(values, starts[:-1])


def _member_compute(problem: Problem, table: MemberTable, machine: np.ndarray):
    """Clin_i, Catt_i, Chead_i and pairs_g."""
    model, training = problem.model, problem.training
    flops = problem.cluster.machine_flops[machine]
    pairs = cost.causal_pairs(training.seq_len, table.group_tokens)
    linear = cost.linear_compute_time(model, training, table.tokens, flops)
    attention_flops = problem.cluster.machine_attention_flops[machine]
    attention = cost.attention_compute_time(model, training, pairs[table.group], table.heads, attention_flops)
    return linear, attention, cost.head_compute_time(model, training, table.tokens, flops), pairs


def _hp_exchanges(problem: Problem, table: MemberTable, units: Units):
    """bw_g, α_g and the two all-to-all exchanges of every group."""
    model, training = problem.model, problem.training
    bw, lat = within_sets(problem.cluster, units)
    group_tokens = table.group_tokens[table.group]
    times = []
    for exchange in (cost.qkv_exchange_bytes, cost.output_exchange_bytes):
        sent, received = exchange(model, training, table.tokens, group_tokens, table.heads)
        times.append(cost.exchange_time(_per_group(np.maximum(sent, received), table), table.group_size, bw, lat))
    return bw, lat, times[0], times[1]


def _ring(problem: Problem, table: MemberTable, units: Units):
    """bw_{g−1,g}, lat_{g−1,g} of every group and ring_i of every member."""
    model, training = problem.model, problem.training
    bw, lat = between_sets(problem.cluster, units, table.prev_group)
    g = table.group
    ring_size = table.ring_size[table.group_replica][g]
    kv = cost.kv_heads_of(model, table.heads)
    return bw, lat, cost.ring_time(model, training, table.group_tokens[g], kv, ring_size, bw[g], lat[g])


def _zero(problem: Problem, table: MemberTable, machine: np.ndarray):
    """bw_r, α_r, Z_layer and Z_ends of every replica."""
    model, training = problem.model, problem.training
    units = Units.of(len(problem.cluster.machines), table.replica, machine, table.num_replicas)
    bw, lat = within_sets(problem.cluster, units)
    devices = table.replica_size
    return (bw, lat, cost.zero_time(training, model.params_per_layer, devices, bw, lat),
            cost.zero_time(training, cost.end_params(model), devices, bw, lat))


def time_parts(problem: Problem, table: MemberTable) -> TimeParts:
    """Every §7.2 term of a structurally sound plan (rules 1–4 hold)."""
    model, training = problem.model, problem.training
    machine = problem.cluster.machine_of_device[table.device]
    linear, attention, head, pairs = _member_compute(problem, table, machine)
    units = Units.of(len(problem.cluster.machines), table.group, machine, table.num_groups)
    hp_bw, hp_lat, qkv, out = _hp_exchanges(problem, table, units)
    ring_bw, ring_lat, ring = _ring(problem, table, units)
    members, groups = table.member_start, table.ring_start
    linear_max, attention_max = _per_replica(linear, members), _per_replica(attention, members)
    ring_max, head_max = _per_replica(ring, members), _per_replica(head, members)
    a2a_max = _per_replica(qkv + out, groups)
    layer = cost.layer_time(training, linear_max, a2a_max, attention_max, ring_max)
    replica_bw, replica_lat, zero_layer, zero_ends = _zero(problem, table, machine)
    micro = cost.micro_batch_time(model, layer, zero_layer, head_max, zero_ends)
    m = table.batch // training.micro_batch
    replica_time = m * micro
    dp_bw, dp_lat = across_sets(problem.cluster, table.replica, machine, table.num_replicas)
    dp = float(cost.dp_time(model, training, table.num_replicas, table.replica_size.min(), dp_bw, dp_lat))
    return TimeParts(
        machine, linear, attention, head, ring, pairs, hp_bw, hp_lat, qkv, out, ring_bw, ring_lat,
        _per_group(ring, table), layer, linear_max, a2a_max, attention_max, ring_max, head_max,
        replica_bw, replica_lat, zero_layer, zero_ends, cost.hp_micro_batch_time(model, training, a2a_max),
        cost.zero_micro_batch_time(model, zero_layer, zero_ends), micro, m, replica_time, dp_bw, dp_lat, dp,
        float(replica_time.max()) + dp)


@dataclass(frozen=True, eq=False)
class MemoryParts:
    """§7.3 per member, bytes."""

    states: np.ndarray
    gathered: float
    activations: np.ndarray
    ring_buffers: np.ndarray
    logits: np.ndarray
    reserve: float
    total: np.ndarray  # the sum, reserve included
    capacity: np.ndarray  # memory_gib·2^30 of the member's GPU type


def memory_parts(problem: Problem, table: MemberTable) -> MemoryParts:
    """Every §7.3 term per member (devices must exist)."""
    model, training = problem.model, problem.training
    g, r = table.group, table.replica
    states = cost.state_bytes(model, training, table.replica_size[r])
    working = cost.working_set_bytes(model, training, table.tokens, table.group_tokens[g], table.heads)
    activations = cost.activation_bytes(model, training, table.tokens, working)
    t_max = _per_replica(table.group_tokens, table.ring_start)[r]
    kv = cost.kv_heads_of(model, table.heads)
    ring_buffers = cost.ring_buffer_bytes(model, training, t_max, kv, table.ring_size[r])
    logits = cost.logits_bytes(model, training, table.tokens)
    gathered, reserve = cost.gathered_bytes(model, training), cost.reserve_bytes(training)
    total = states + gathered + activations + ring_buffers + logits + reserve
    capacity = problem.cluster.machine_memory_bytes[problem.cluster.machine_of_device[table.device]]
    return MemoryParts(states, gathered, activations, ring_buffers, logits, reserve, total, capacity)


def require_valid_structure(problem: Problem, table: MemberTable) -> None:
    violations = structural_violations(problem, table)
    if violations:
        raise InvalidPlanError(violations)


def iteration_time(problem: Problem, plan: SeqPlan | MemberTable, check: bool = True) -> float:
    """T of docs/sequence-plans.md §7.2 only: the solvers' inner loop. Takes a plan or a `MemberTable`;
    `check=False` skips rules 1–4 (the caller vouches for them)."""
    table = plan if isinstance(plan, MemberTable) else MemberTable.of(plan)
    if check:
        require_valid_structure(problem, table)
    return time_parts(problem, table).iteration
