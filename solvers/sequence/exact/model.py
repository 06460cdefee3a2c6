"""The CP-SAT model of one ring structure: docs/formulation.md §7.1, families [Q1]…[Q9].

The structure (groups, ring order, hence every link figure) is fixed [S1]/[S2]; the model
chooses, per member i of group g, its kv heads h_i (heads_i = h_i·a/k) and token blocks u_i
(t_i = q·u_i), and per group its half-shard U_g (T_g = 2q·U_g), minimising T_mb of §7.2
under the memory bound of §7.3. Every §7.2 term is a function of one integer of the model
(u_i, P_i = U_g·h_i, V_i = (s/2q − U_g)·h_i or Y_g = max_i max(A_i, B_i)), so each is an
Element look-up in a table of that term's `planner.sequence.cost` value, floored to the time
unit: a term loses < 1 unit, T_mb < E = L·(2 + r_a2a) + 1 units [Q9]. Memory is exact in
integers [Q8].

`build_model(problem, spec, scale)` returns the model and its variables, grouped by family in
frozen dataclasses (as the layered CP-SAT model does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from planner.problem import Problem
from planner.sequence import cost
from planner.sequence import pricing
from solvers.sequence.exact.structure import RingSpec
from solvers.sequence.space import table_of

EPS = 1e-10  # target rounding error of T_mb relative to its lower bound
LARGEST_UNITS = 2**36  # the unit is coarsened until every time table stays below this


@dataclass(frozen=True)
class Scale:
    """The integer time unit of one device set (all its structures share it)."""

    unit: float  # seconds per unit
    error_units: int  # E: the model's T_mb is > true T_mb − E units, ≤ true T_mb
    constant_s: float  # L·Z_layer + Z_ends of the set (no variable enters it)

    def floor(self, seconds) -> list[int]:
        return [int(math.floor(x / self.unit)) for x in np.atleast_1d(seconds)]


@dataclass(frozen=True)
class MemberVars:
    heads: list  # h_i ∈ [1, k], kv heads
    blocks: list  # u_i ∈ [1, 2U], token blocks of q
    pairs: list  # P_i = U_g·h_i
    own: list  # Q_i = u_i·h_i


@dataclass(frozen=True)
class TimeVars:
    linear: cp_model.IntVar  # ≥ floor(Clin_i) for all i
    a2a: cp_model.IntVar  # ≥ floor(a2a_g) for all g with n_g > 1
    attention: cp_model.IntVar  # ≥ floor(Catt_i), ≥ floor(ρ·ring_i)
    head: cp_model.IntVar  # ≥ floor(Chead_i)
    objective: cp_model.LinearExpr | None  # [Q9], set once every term is bounded


@dataclass(frozen=True)
class ModelVars:
    shard: list  # U_g ∈ [1, U]
    members: MemberVars
    exchange: list  # Y_g (None for one member)
    longest: cp_model.IntVar | None  # T_max/2q ≥ U_g (G > 1 only)
    time: TimeVars


def shard_units(problem: Problem) -> int:
    return problem.training.seq_len // (2 * problem.training.token_block)


def constant_time(problem: Problem, devices) -> float:
    """L·Z_layer + Z_ends of a replica on `devices` (the pricing's own ZeRO-3 terms)."""
    table = table_of([[[(d, 1, 1) for d in devices]]], [problem.training.micro_batch])
    machine = problem.cluster.machine_of_device[table.device]
    _, _, z_layer, z_ends = pricing._zero(problem, table, machine)
    return float(problem.model.layers * z_layer[0] + z_ends[0])


def _per_block(problem: Problem, machines) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clin, Chead per token block and Catt per unit of P = U_g·h_i, per machine given."""
    model, training = problem.model, problem.training
    q, s = training.token_block, training.seq_len
    flops = problem.cluster.machine_flops[np.asarray(machines)]
    attention_flops = problem.cluster.machine_attention_flops[np.asarray(machines)]
    per_kv = model.heads // model.num_kv_heads
    return (cost.linear_compute_time(model, training, q, flops), cost.head_compute_time(model, training, q, flops),
            cost.attention_compute_time(model, training, q * (s + 1), per_kv, attention_flops))


def scale_of(problem: Problem, devices, largest_s: float) -> Scale:
    """[Q9] unit = EPS·lb/E, lb = L·max_i Clin_i + max_i Chead_i at their least (Σ u_i = s/q
    over the set, so max_i c_i·u_i ≥ (s/q)/Σ_i 1/c_i) plus the constant; coarsened so that
    `largest_s`, the largest table entry of the set's structures, stays below LARGEST_UNITS."""
    model, training = problem.model, problem.training
    lin, head, _ = _per_block(problem, problem.cluster.machine_of_device[list(devices)])
    blocks = 2 * shard_units(problem)
    const = constant_time(problem, devices)
    lb = model.layers * blocks / np.sum(1 / lin) + blocks / np.sum(1 / head) + const
    error = model.layers * (2 + cost.a2a_rounds(training)) + 1
    unit = max(EPS * lb / error, largest_s / LARGEST_UNITS)
    return Scale(unit=float(unit), error_units=error, constant_s=const)


@dataclass(frozen=True)
class Tables:
    """One structure's cost tables in seconds (index = the model integer) and memory in
    integers scaled by k [Q8]."""

    linear: list  # per member: Clin at u = 0..2U
    head: list  # per member: Chead at u = 0..2U
    attention: list  # per member: Catt at P = 0..kU
    a2a: list  # per group: a2a_g at Y = 0..2kU (None for one member)
    ring: list  # per group: ρ·ring at V = 0..kU (None when G = 1)
    mem_blocks: int  # k·bytes per u_i
    mem_pairs: int  # k·bytes per P_i
    mem_ring: int  # k·bytes per T_max/2q·h_i (0 when G = 1)
    mem_room: list  # per member: floor(k·(capacity − states − gathered − reserve))

    @property
    def largest(self) -> float:
        tops = [t[-1] for t in self.linear + self.head + self.attention + self.a2a + self.ring if t is not None]
        return float(max(tops))


def _exact_int(x: float) -> int:
    n = int(round(x))
    if abs(n - x) > 1e-6 * max(1.0, abs(x)):
        raise ValueError(f"memory coefficient {x} is not an integer")
    return n


def _memory(problem: Problem, spec: RingSpec) -> tuple[int, int, int, list]:
    """[Q8] memory_i·k = k·cu·u_i + cp·P_i + cr·T_max·h_i from the §7.3 functions."""
    model, training = problem.model, problem.training
    q, k, per_kv = training.token_block, model.num_kv_heads, model.heads // model.num_kv_heads
    cu = (cost.activation_bytes(model, training, q, cost.working_set_bytes(model, training, q, 0, 0))
          + cost.logits_bytes(model, training, q))
    cp = cost.activation_bytes(model, training, 0, cost.working_set_bytes(model, training, 0, 2 * q, per_kv))
    cr = float(cost.ring_buffer_bytes(model, training, 2 * q, 1, 2)) if len(spec.groups) > 1 else 0.0
    n = len(spec.devices)
    fixed = (cost.state_bytes(model, training, n) + cost.gathered_bytes(model, training)
             + cost.reserve_bytes(training))
    capacity = problem.cluster.machine_memory_bytes[[m for g in spec.machine for m in g]]
    room = [int(math.floor(k * (c - fixed))) for c in capacity]
    return _exact_int(k * cu), _exact_int(k * cp), _exact_int(k * cr), room


def tables_of(problem: Problem, spec: RingSpec) -> Tables:
    """Every §7.2 term of the structure as a function of its model integer."""
    model, training = problem.model, problem.training
    q, k, big_u = training.token_block, model.num_kv_heads, shard_units(problem)
    machines = [m for g in spec.machine for m in g]
    lin, head, att = _per_block(problem, machines)
    blocks, pairs, exch = np.arange(2 * big_u + 1), np.arange(k * big_u + 1), np.arange(2 * k * big_u + 1)
    qkv = cost.qkv_exchange_bytes(model, training, q, q, 0)[0] / k  # bytes per unit of Y [Q5]
    out = cost.output_exchange_bytes(model, training, q, q, 0)[1] / k
    a2a, ring, size = [], [], len(spec.groups)
    for g, members in enumerate(spec.groups):
        n, bw, lat = len(members), spec.hp_bw[g], spec.hp_lat[g]
        a2a.append(None if n == 1 else (cost.exchange_time(exch * qkv, n, bw, lat)
                                        + cost.exchange_time(exch * out, n, bw, lat)).tolist())
        ring.append(None if size == 1 else (cost.ring_rounds(training) * cost.ring_time(
            model, training, training.seq_len - 2 * q, pairs, size, spec.ring_bw[g], spec.ring_lat[g])).tolist())
    return Tables([(c * blocks).tolist() for c in lin], [(c * blocks).tolist() for c in head],
                  [(c * pairs).tolist() for c in att], a2a, ring, *_memory(problem, spec))


def _member_vars(m: cp_model.CpModel, spec: RingSpec, shard: list, k: int, big_u: int) -> MemberVars:
    """[Q2] Σ_{i∈g} h_i = k; [Q3] Σ_{i∈g} u_i = 2U_g; [Q4] P_i = U_g·h_i, Q_i = u_i·h_i;
    [S3] identical members (same machine, same group) take non-increasing u_i."""
    heads, blocks, pairs, own = [], [], [], []
    for g, members in enumerate(spec.groups):
        hs = [m.new_int_var(1, k, f"h{g}_{j}") for j in range(len(members))]
        us = [m.new_int_var(1, 2 * big_u, f"u{g}_{j}") for j in range(len(members))]
        m.add(sum(hs) == k)
        m.add(sum(us) == 2 * shard[g])
        for j in range(len(members) - 1):
            if spec.machine[g][j] == spec.machine[g][j + 1]:
                m.add(us[j] >= us[j + 1])
        for h, u in zip(hs, us):
            p, o = m.new_int_var(0, k * big_u, ""), m.new_int_var(0, 2 * k * big_u, "")
            m.add_multiplication_equality(p, [shard[g], h])
            m.add_multiplication_equality(o, [u, h])
            pairs.append(p)
            own.append(o)
        heads += hs
        blocks += us
    return MemberVars(heads, blocks, pairs, own)


def _element(m: cp_model.CpModel, index, values: list[int], floor_of: cp_model.IntVar) -> None:
    """floor_of ≥ values[index] (an Element look-up)."""
    target = m.new_int_var(min(values), max(values), "")
    m.add_element(index, values, target)
    m.add(floor_of >= target)


def build_model(problem: Problem, spec: RingSpec, tb: Tables, scale: Scale,
                cutoff: int | None = None) -> tuple[cp_model.CpModel, ModelVars]:
    """The model of one structure; `cutoff` (units): keep only plans with model T_mb ≤ cutoff."""
    model, training = problem.model, problem.training
    k, big_u, n_groups = model.num_kv_heads, shard_units(problem), len(spec.groups)
    m = cp_model.CpModel()
    shard = [m.new_int_var(1, big_u, f"U{g}") for g in range(n_groups)]
    m.add(sum(shard) == big_u)  # [Q1] Σ_g T_g = s
    mv = _member_vars(m, spec, shard, k, big_u)
    top = scale.floor(tb.largest)[0] + 1
    x = TimeVars(*(m.new_int_var(0, top, name) for name in ("lin", "a2a", "att", "head")), objective=None)
    group_of = [g for g, members in enumerate(spec.groups) for _ in members]
    for i, (u, p) in enumerate(zip(mv.blocks, mv.pairs)):
        _element(m, u, scale.floor(tb.linear[i]), x.linear)  # [Q7] Clin, Chead, Catt
        _element(m, u, scale.floor(tb.head[i]), x.head)
        _element(m, p, scale.floor(tb.attention[i]), x.attention)
    exchange = _a2a(m, spec, tb, scale, mv, group_of, x.a2a, k)
    longest = _ring(m, spec, tb, scale, mv, shard, group_of, x.attention, big_u)
    _memory_rows(m, tb, mv, longest, big_u, k)
    objective = model.layers * (x.linear + cost.a2a_rounds(training) * x.a2a + x.attention) + x.head
    if cutoff is not None:
        m.add(objective <= cutoff)
    m.minimize(objective)
    return m, ModelVars(shard, mv, exchange, longest, TimeVars(x.linear, x.a2a, x.attention, x.head, objective))


def _a2a(m, spec: RingSpec, tb: Tables, scale: Scale, mv: MemberVars, group_of, x_a2a, k: int) -> list:
    """[Q5] Y_g ≥ A_i = k·u_i − Q_i and ≥ B_i = 2P_i − Q_i (the two exchanges' max_i
    max(sent_i, received_i) are Y_g times bytes per unit); x_a2a ≥ floor(a2a_g(Y_g))."""
    out = []
    for g, table in enumerate(tb.a2a):
        if table is None:
            out.append(None)
            continue
        y = m.new_int_var(0, len(table) - 1, f"Y{g}")
        for i in (i for i, gi in enumerate(group_of) if gi == g):
            m.add(y >= k * mv.blocks[i] - mv.own[i])
            m.add(y >= 2 * mv.pairs[i] - mv.own[i])
        _element(m, y, scale.floor(table), x_a2a)
        out.append(y)
    return out


def _ring(m, spec: RingSpec, tb: Tables, scale: Scale, mv: MemberVars, shard, group_of, x_att, big_u: int):
    """[Q6] V_i = U·h_i − P_i = (s − T_g)/2q·kv_i; x_att ≥ floor(ρ·ring_i(V_i)); T_max/2q ≥ U_g."""
    if len(spec.groups) == 1:
        return None
    for i, g in enumerate(group_of):
        v = m.new_int_var(0, len(tb.ring[g]) - 1, "")
        m.add(v == big_u * mv.heads[i] - mv.pairs[i])
        _element(m, v, scale.floor(tb.ring[g]), x_att)
    longest = m.new_int_var(1, big_u, "Tmax")
    for u in shard:
        m.add(longest >= u)
    return longest


def _memory_rows(m, tb: Tables, mv: MemberVars, longest, big_u: int, k: int) -> None:
    """[Q8] rule 5, exact in integers: k·memory_i − k·fixed ≤ floor(k·(capacity − fixed))."""
    for i, (u, p, h) in enumerate(zip(mv.blocks, mv.pairs, mv.heads)):
        row = tb.mem_blocks * u + tb.mem_pairs * p
        if longest is not None and tb.mem_ring:
            r = m.new_int_var(0, big_u * k, "")
            m.add_multiplication_equality(r, [longest, h])
            row = row + tb.mem_ring * r
        m.add(row <= tb.mem_room[i])
