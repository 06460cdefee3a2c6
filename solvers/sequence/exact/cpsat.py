"""The exact CP-SAT solver of sequence plans: docs/formulation.md §7.1.

Outside the model, exactly as brute force does [B1]/[B2] and with the symmetries [S1]/[S2]:
the used devices, their split into replicas, each replica's groups and ring order, and the
batch split. Inside one CP-SAT model per ring structure (`model.build_model`): heads and
tokens of every member and each group's shard, under the memory bound. A replica's device
set is solved once per [S1] key; its structures share a time unit, and each model after the
first keeps only plans better than the best model T_mb so far (a cutoff, [S4]). Every ring
and every plan is priced again by the planner; a memory or price mismatch raises.
"""

from __future__ import annotations

import math
import time

from ortools.sat.python import cp_model

from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions
from solvers.cp_sat import cp_solver
from solvers.sequence.exact import driver
from solvers.sequence.exact.driver import SetOutcome
from solvers.sequence.exact.model import ModelVars, build_model, scale_of, tables_of
from solvers.sequence.exact.structure import Key, RingSpec, canonical_devices, structures
from solvers.sequence.space import ring_overflow

NAME = "cpsat"
MAX_DEVICES, MAX_UNITS = driver.MAX_DEVICES, driver.MAX_UNITS


def _ring_of(solver: cp_model.CpSolver, spec: RingSpec, mv: ModelVars, problem: Problem) -> list:
    q, per_kv = problem.training.token_block, problem.model.heads // problem.model.num_kv_heads
    heads, blocks, ring, i = mv.members.heads, mv.members.blocks, [], 0
    for group in spec.groups:
        ring.append([(d, per_kv * solver.value(heads[i + j]), q * solver.value(blocks[i + j]))
                     for j, d in enumerate(group)])
        i += len(group)
    return ring


def _solve_one(problem: Problem, out: SetOutcome, spec: RingSpec, tb, scale, cutoff, deadline, threads):
    """One structure's model; updates `out`; returns the model T_mb (units) when improved."""
    m, mv = build_model(problem, spec, tb, scale, cutoff)
    proto = m.proto
    out.models, out.variables, out.constraints = out.models + 1, out.variables + len(proto.variables), \
        out.constraints + len(proto.constraints)
    solver = cp_solver(time_limit_s=max(0.01, deadline - time.perf_counter()), threads=threads)
    status = solver.solve(m)
    out.solve_s.append(solver.wall_time)
    if status == cp_model.INFEASIBLE:
        floor_units = math.inf if cutoff is None else cutoff + 1  # [S4] nothing below the cutoff
        out.bound = min(out.bound, floor_units * scale.unit + scale.constant_s)
        return None
    out.complete &= status == cp_model.OPTIMAL
    bound_units = solver.best_objective_bound if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else 0
    out.bound = min(out.bound, bound_units * scale.unit + scale.constant_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    ring = _ring_of(solver, spec, mv, problem)
    tmb, over = ring_overflow(problem, [ring])
    if over[0] > 0:
        raise AssertionError(f"CP-SAT ring {ring} does not fit in memory when priced ({over[0]:.0f} B over)")
    model_s = solver.objective_value * scale.unit + scale.constant_s
    if not model_s - 1e-9 * tmb[0] <= tmb[0] <= model_s + out.error_s + 1e-9 * tmb[0]:
        raise AssertionError(f"model T_mb {model_s} s and priced {tmb[0]} s disagree beyond the rounding")
    if tmb[0] < out.tmb:
        out.ring, out.tmb = ring, float(tmb[0])
    return int(round(solver.objective_value))


def best_ring(problem: Problem, key: Key, deadline: float, threads: int) -> SetOutcome:
    """The least T_mb over every ring of the key's devices that fits [B1], [S1]–[S4]."""
    devices = canonical_devices(problem, key)
    specs = structures(problem, key)
    tables = [tables_of(problem, spec) for spec in specs]
    out = SetOutcome()
    if not specs:
        return out
    scale = scale_of(problem, devices, max(tb.largest for tb in tables))
    out.error_s = scale.error_units * scale.unit
    cutoff = None
    for spec, tb in zip(specs, tables):
        if time.perf_counter() >= deadline:
            out.complete, out.bound = False, min(out.bound, scale.constant_s)
            break
        found = _solve_one(problem, out, spec, tb, scale, cutoff, deadline, threads)
        if found is not None:
            cutoff = found - 1
    return out


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The optimum over the whole §7.1 space of a small problem (docs/formulation.md §7.1)."""
    return driver.solve_exact(problem, options, NAME, "CP-SAT", best_ring, _note)


def _note(outcomes: dict) -> str:
    size = driver.model_size(outcomes)
    models = sum(o.models for o in outcomes.values())
    error = max((o.error_s for o in outcomes.values()), default=0.0)
    solve_s = [s for o in outcomes.values() for s in o.solve_s]
    return (f"{models} CP-SAT models over {len(outcomes)} device sets, {size.variables} variables and "
            f"{size.constraints} constraints in all, slowest solve {max(solve_s, default=0.0):.3f} s; "
            f"model T_mb within {error:.3g} s of the true T_mb (time unit rounding, [Q9])")
