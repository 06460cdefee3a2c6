"""The exact MILP solver of sequence plans (PuLP → HiGHS, CBC as fallback):
docs/formulation.md §7.1.1, families [M-S1]…[M-S8].

The same structures [S1]/[S2], symmetry [S3], cutoff [S4] and outer loop (`driver`) as the
CP-SAT solver; only the model of one ring structure differs. Its integers are those of [Q1]–[Q3]
(U_g, u_i; h_i as a one-hot over 1..k); the products of [Q4] (P_i = U_g·h_i, Q_i = u_i·h_i,
R_i = T_max/2q·h_i) are exact linearisations of integer × binary; every Element look-up of
[Q5]–[Q7] is a one-hot over the integer's values with the `planner.sequence.cost` table (in
seconds) as coefficients, or — where the table is affine in its integer, which every §7.2 term
is — the affine expression itself (the same value at every integer point); the maxima of
T_layer are epigraph rows. Nothing is floored: the model's T_mb is the planner's up to floating
point, so there is no time unit and no E of [Q9].
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pulp

from planner.problem import Problem
from planner.sequence import cost
from solvers.common import SolveResult, SolverOptions
from solvers.milp_backend import highs_solve_error, highs_threads, quiet_stdout, read_status
from solvers.sequence.exact import driver
from solvers.sequence.exact.driver import SetOutcome
from solvers.sequence.exact.model import Tables, _per_block, constant_time, shard_units, tables_of
from solvers.sequence.exact.structure import Key, RingSpec, canonical_devices, structures
from solvers.sequence.space import ring_overflow

NAME = "milp"
GAP = 1e-9  # relative MIP gap: "optimal" means optimal to float tolerance
TOL = 1e-9  # feasibility and integrality tolerances
# HiGHS's defaults, for a second solve where 1e-9 could not be met (rows with 1e8 coefficients: a slow
# link beside fast GPUs); it had left the structure unproven, and the solve `feasible`
RETRY_TOL = 1e-7
# the model's T_mb and the planner's differ by HiGHS's feasibility tolerances (1e-7 on scaled rows,
# so more on rows whose coefficients span 1e-5…1e4 GB/s: 1.9e-7 was seen); the priced one is kept
PRICE_TOL = 1e-5
AFFINE_TOL = 1e-12


@dataclass(frozen=True)
class MilpVars:
    shard: list  # U_g ∈ [1, U]
    heads: list  # per member: {h: binary} one-hot of h_i over 1..k
    blocks: list  # u_i ∈ [1, 2U]
    objective: object  # [M-S8] in time units of `unit`


class _Builder:
    """One structure's MILP; times in units of `unit` seconds (so the objective is ≥ ~1)."""

    def __init__(self, problem: Problem, tb: Tables, unit: float, onehot: bool):
        self.problem, self.tb, self.unit, self.onehot = problem, tb, unit, onehot
        self.lp = pulp.LpProblem("hexiscale_seq", pulp.LpMinimize)
        self.count = 0

    def var(self, low=0.0, up=None, cat=pulp.LpContinuous):
        self.count += 1
        return self.lp.add_variable(f"v{self.count}", lowBound=low, upBound=up, cat=cat)

    def add(self, row) -> None:
        self.lp += row

    def product(self, onehot: dict, x, top: int):
        """[M-S2] x·h = Σ_v v·w_v for x ∈ [0, top] and h = Σ_v v·z_v one-hot: Σ_v w_v = x and
        0 ≤ w_v ≤ top·z_v put all of x on the one v with z_v = 1 (disaggregated, exact)."""
        w = {v: self.var(0, top) for v in onehot}
        for v, z in onehot.items():
            self.add(w[v] <= top * z)
        self.add(pulp.lpSum(w.values()) == x)
        return pulp.lpSum(v * wv for v, wv in w.items())

    def lookup(self, index, values: list, low: int = 0):
        """[M-S3] values[index] for an integer expression index ∈ [low, len − 1], in units."""
        vals = np.asarray(values, dtype=float) / self.unit
        step = vals[1] - vals[0] if len(vals) > 1 else 0.0
        line = vals[0] + step * np.arange(len(vals))
        if not self.onehot and np.all(np.abs(line - vals) <= AFFINE_TOL * max(1.0, float(np.abs(vals).max()))):
            return float(vals[0]) + float(step) * index
        e = {v: self.var(cat=pulp.LpBinary) for v in range(low, len(vals))}
        self.add(pulp.lpSum(e.values()) == 1)
        self.add(pulp.lpSum(v * b for v, b in e.items()) == index)
        return pulp.lpSum(float(vals[v]) * b for v, b in e.items())


def _members(b: _Builder, spec: RingSpec, shard: list, k: int, big_u: int):
    """[M-S1] Σ_{i∈g} h_i = k, Σ_{i∈g} u_i = 2U_g ([Q2], [Q3]); [S3] u_j ≥ u_{j+1} on one machine;
    [M-S2] P_i = U_g·h_i, Q_i = u_i·h_i."""
    heads, blocks, pairs, own = [], [], [], []
    for g, members in enumerate(spec.groups):
        hs = [{v: b.var(cat=pulp.LpBinary) for v in range(1, k + 1)} for _ in members]
        us = [b.var(1, 2 * big_u, pulp.LpInteger) for _ in members]
        for z in hs:
            b.add(pulp.lpSum(z.values()) == 1)
        b.add(pulp.lpSum(v * z[v] for z in hs for v in z) == k)
        b.add(pulp.lpSum(us) == 2 * shard[g])
        for j in range(len(members) - 1):
            if spec.machine[g][j] == spec.machine[g][j + 1]:
                b.add(us[j] >= us[j + 1])
        for z, u in zip(hs, us):
            pairs.append(b.product(z, shard[g], big_u))
            own.append(b.product(z, u, 2 * big_u))
        heads += hs
        blocks += us
    return heads, blocks, pairs, own


def _heads(z: dict):
    return pulp.lpSum(v * x for v, x in z.items())


def build_milp(problem: Problem, spec: RingSpec, tb: Tables, unit: float, cutoff: float | None = None,
               onehot: bool = False) -> tuple[pulp.LpProblem, MilpVars]:
    """The MILP of one structure; `cutoff` (units): keep only plans with model T_mb ≤ cutoff."""
    model, training = problem.model, problem.training
    k, big_u = model.num_kv_heads, shard_units(problem)
    b = _Builder(problem, tb, unit, onehot)
    shard = [b.var(1, big_u, pulp.LpInteger) for _ in spec.groups]
    b.add(pulp.lpSum(shard) == big_u)  # [Q1]
    heads, blocks, pairs, own = _members(b, spec, shard, k, big_u)
    x_lin, x_a2a, x_att, x_head = (b.var() for _ in range(4))
    for i, (u, p) in enumerate(zip(blocks, pairs)):  # [M-S4] = [Q7] as epigraph rows
        b.add(x_lin >= b.lookup(u, tb.linear[i], 1))
        b.add(x_head >= b.lookup(u, tb.head[i], 1))
        b.add(x_att >= b.lookup(p, tb.attention[i], 1))
    group_of = [g for g, members in enumerate(spec.groups) for _ in members]
    _a2a(b, tb, blocks, pairs, own, group_of, x_a2a, k)
    longest = _ring(b, spec, tb, heads, pairs, shard, group_of, x_att, big_u)
    _memory_rows(b, tb, heads, blocks, pairs, longest, big_u)
    objective = model.layers * (x_lin + cost.a2a_rounds(training) * x_a2a + x_att) + x_head  # [M-S8]
    if cutoff is not None:
        b.add(objective <= cutoff)
    b.lp += objective
    return b.lp, MilpVars(shard, heads, blocks, objective)


def _a2a(b: _Builder, tb: Tables, blocks, pairs, own, group_of, x_a2a, k: int) -> None:
    """[M-S5] = [Q5]: Y_g ≥ k·u_i − Q_i, Y_g ≥ 2P_i − Q_i; x_a2a ≥ a2a_g(Y_g) (n_g > 1 only)."""
    for g, table in enumerate(tb.a2a):
        if table is None:
            continue
        y = b.var(0, len(table) - 1, pulp.LpInteger if b.onehot else pulp.LpContinuous)
        for i in (i for i, gi in enumerate(group_of) if gi == g):
            b.add(y >= k * blocks[i] - own[i])
            b.add(y >= 2 * pairs[i] - own[i])
        b.add(x_a2a >= b.lookup(y, table))


def _ring(b: _Builder, spec: RingSpec, tb: Tables, heads, pairs, shard, group_of, x_att, big_u: int):
    """[M-S6] = [Q6]: x_att ≥ ρ·ring_g(U·h_i − P_i); T_max/2q ≥ U_g (G > 1 only)."""
    if len(spec.groups) == 1:
        return None
    for i, g in enumerate(group_of):
        b.add(x_att >= b.lookup(big_u * _heads(heads[i]) - pairs[i], tb.ring[g]))
    longest = b.var(1, big_u, pulp.LpInteger)
    for u in shard:
        b.add(longest >= u)
    return longest


def _memory_rows(b: _Builder, tb: Tables, heads, blocks, pairs, longest, big_u: int) -> None:
    """[M-S7] = [Q8]: k·cu·u_i + cp·P_i + cr·R_i ≤ room_i, R_i = (T_max/2q)·h_i."""
    for i, (z, u, p) in enumerate(zip(heads, blocks, pairs)):
        row = tb.mem_blocks * u + tb.mem_pairs * p
        if longest is not None and tb.mem_ring:
            row = row + tb.mem_ring * b.product(z, longest, big_u)
        b.add(row <= tb.mem_room[i])


def time_unit(problem: Problem, devices) -> float:
    """L·(s/q)/Σ_i 1/c_lin,i + (s/q)/Σ_i 1/c_head,i: a lower bound on T_mb minus its constant
    (as in [Q9]); times are divided by it so that the objective is ≥ 1 and the gap is relative."""
    lin, head, _ = _per_block(problem, problem.cluster.machine_of_device[list(devices)])
    blocks = 2 * shard_units(problem)
    return float(problem.model.layers * blocks / np.sum(1 / lin) + blocks / np.sum(1 / head))


def _solver(threads: int, seconds: float, tol: float = TOL):
    if pulp.HiGHS().available():
        return pulp.HiGHS(msg=False, timeLimit=seconds, threads=threads, gapRel=GAP, gapAbs=1e-12,
                          mip_feasibility_tolerance=tol, primal_feasibility_tolerance=tol)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=seconds, threads=threads, gapRel=GAP)


def _ring_of(v: MilpVars, spec: RingSpec, problem: Problem) -> list:
    q, per_kv = problem.training.token_block, problem.model.heads // problem.model.num_kv_heads
    ring, i = [], 0
    for group in spec.groups:
        ring.append([(d, per_kv * int(round(pulp.value(_heads(v.heads[i + j])))),
                      q * int(round(v.blocks[i + j].value()))) for j, d in enumerate(group)])
        i += len(group)
    return ring


def _solve_one(problem: Problem, out: SetOutcome, spec: RingSpec, tb: Tables, unit: float, const: float,
               cutoff, deadline: float, threads: int, onehot: bool):
    """One structure's MILP; updates `out`; returns the model T_mb (units) when solved."""
    lp, v = build_milp(problem, spec, tb, unit, cutoff, onehot)
    out.models, out.variables, out.constraints = (out.models + 1, out.variables + len(lp.variables()),
                                                  out.constraints + lp.numConstraints())
    start = time.perf_counter()
    for tol in (TOL, RETRY_TOL):  # the second only after HiGHS's solve error (`highs_solve_error`)
        solver = _solver(threads, min(1e6, max(0.01, deadline - time.perf_counter())), tol)
        highs_threads(threads)
        with quiet_stdout(True):
            lp.solve(solver)
        if not highs_solve_error(lp) or time.perf_counter() > deadline:
            break
    out.solve_s.append(time.perf_counter() - start)
    status, has, bound_units = read_status(lp, solver)
    if status == "infeasible":
        floor_units = math.inf if cutoff is None else cutoff * (1 - GAP)  # [S4]
        out.bound = min(out.bound, floor_units * unit + const)
        return None
    out.complete &= status == "optimal"
    out.bound = min(out.bound, max(0.0, bound_units or 0.0) * (1 - GAP) * unit + const)
    if not has:
        return None
    ring = _ring_of(v, spec, problem)
    tmb, over = ring_overflow(problem, [ring])
    if over[0] > 0:
        raise AssertionError(f"MILP ring {ring} does not fit in memory when priced ({over[0]:.0f} B over)")
    model_s = pulp.value(v.objective) * unit + const
    if abs(model_s - tmb[0]) > PRICE_TOL * tmb[0]:
        raise AssertionError(f"MILP T_mb {model_s} s and priced {tmb[0]} s disagree")
    if tmb[0] < out.tmb:
        out.ring, out.tmb = ring, float(tmb[0])
    return pulp.value(v.objective)


def best_ring(problem: Problem, key: Key, deadline: float, threads: int, onehot: bool = False) -> SetOutcome:
    """The least T_mb over every ring of the key's devices that fits [B1], [S1]–[S4]."""
    devices = canonical_devices(problem, key)
    specs, out = structures(problem, key), SetOutcome()
    if not specs:
        return out
    unit, const = time_unit(problem, devices), constant_time(problem, devices)
    cutoff = None
    for spec in specs:
        if time.perf_counter() >= deadline:
            out.complete, out.bound = False, min(out.bound, const)
            break
        found = _solve_one(problem, out, spec, tables_of(problem, spec), unit, const, cutoff, deadline,
                           threads, onehot)
        if found is not None:
            cutoff = found if cutoff is None else min(cutoff, found)
    return out


def solve(problem: Problem, options: SolverOptions | None = None, *, onehot: bool = False) -> SolveResult:
    """The optimum over the whole §7.1 space of a small problem (docs/formulation.md §7.1.1);
    `onehot` forces the one-hot look-up of [M-S3] even for affine tables."""
    def ring_fn(p, key, deadline, threads):
        return best_ring(p, key, deadline, threads, onehot)

    return driver.solve_exact(problem, options, NAME, "MILP", ring_fn, _note)


def _note(outcomes: dict) -> str:
    size = driver.model_size(outcomes)
    models = sum(o.models for o in outcomes.values())
    solve_s = [s for o in outcomes.values() for s in o.solve_s]
    return (f"{models} MILP models (HiGHS) over {len(outcomes)} device sets, {size.variables} variables and "
            f"{size.constraints} constraints in all, slowest solve {max(solve_s, default=0.0):.3f} s; "
            f"exact in floating point (no time unit)")
