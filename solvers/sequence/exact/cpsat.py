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

import itertools
import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import ModelSize, SolveResult, SolverOptions
from solvers.sequence.brute import best_batches, set_partitions
from solvers.sequence.exact.model import ModelVars, build_model, scale_of, shard_units, tables_of
from solvers.sequence.exact.structure import Key, RingSpec, canonical_devices, key_of, rename, structures
from solvers.sequence.space import dp_time, memory_proof, plan_time, result, ring_overflow

NAME = "cpsat"
MAX_DEVICES, MAX_UNITS = 6, 512


@dataclass
class SetOutcome:
    """The best ring of one [S1] key: its ring on the canonical devices and true T_mb, a
    proven lower bound on T_mb (inf: no ring fits), whether every model finished."""

    ring: list | None = None
    tmb: float = math.inf
    bound: float = math.inf
    complete: bool = True
    error_s: float = 0.0  # E·unit of [Q9]
    models: int = 0
    variables: int = 0
    constraints: int = 0
    solve_s: list = field(default_factory=list)


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
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    solver.parameters.num_workers = threads
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


def _too_big(problem: Problem) -> str | None:
    n, units = problem.cluster.num_devices, shard_units(problem)
    if n > MAX_DEVICES or units > MAX_UNITS:
        return (f"the exact sequence model handles ≤ {MAX_DEVICES} devices and ≤ {MAX_UNITS} shard units "
                f"s/(2q); this problem has {n} devices and {units} units")
    return None


def _replica_splits(problem: Problem):
    """[B1] every used device set and its split into replicas (≤ B/b of them)."""
    n, micro = problem.cluster.num_devices, problem.training.global_batch // problem.training.micro_batch
    for used in range(1, n + 1):
        for subset in itertools.combinations(range(n), used):
            for replicas in set_partitions(subset):
                if len(replicas) <= micro:
                    yield replicas


def _combine(problem: Problem, outcomes: dict, replicas, best, bound: float):
    """T and the proven bound of one replica split [B1]: batches split exactly, T_dp added."""
    training = problem.training
    micro = training.global_batch // training.micro_batch
    found = [outcomes[key_of(problem, r)] for r in replicas]
    if any(math.isinf(f.bound) for f in found):
        return best, bound  # a replica's devices hold no ring: proven by its models
    dp = dp_time(problem, [[[(d, 1, 1) for d in r]] for r in replicas])
    bound = min(bound, best_batches(micro, [f.bound for f in found])[0] + dp)
    if any(f.ring is None for f in found):
        return best, bound
    _, m = best_batches(micro, [f.tmb for f in found])
    batches = [x * training.micro_batch for x in m]
    rings = [rename(problem, f.ring, r) for f, r in zip(found, replicas)]
    t, fits = plan_time(problem, batches, rings)
    if not fits:
        raise AssertionError(f"CP-SAT plan {rings} does not fit in memory when priced whole")
    return (best if best is not None and best[0] <= t else (t, batches, rings)), bound


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The optimum over the whole §7.1 space of a small problem (docs/formulation.md §7.1)."""
    options = options or SolverOptions()
    start = time.perf_counter()
    if (why := _too_big(problem)) is not None:
        return SolveResult(solver=NAME, status=SolveStatus.unknown, wall_s=0.0, message=why)
    deadline = start + options.time_limit_s
    outcomes: dict[Key, SetOutcome] = {}
    best, bound = None, math.inf
    for replicas in _replica_splits(problem):
        for r in replicas:
            key = key_of(problem, r)
            if key not in outcomes:
                outcomes[key] = best_ring(problem, key, deadline, options.threads)
        best, bound = _combine(problem, outcomes, replicas, best, bound)
    return _result(problem, start, outcomes, best, bound)


def _result(problem: Problem, start: float, outcomes: dict, best, bound: float) -> SolveResult:
    complete = all(o.complete for o in outcomes.values())
    size = ModelSize(variables=sum(o.variables for o in outcomes.values()),
                     constraints=sum(o.constraints for o in outcomes.values()))
    models = sum(o.models for o in outcomes.values())
    error = max((o.error_s for o in outcomes.values()), default=0.0)
    solve_s = [s for o in outcomes.values() for s in o.solve_s]
    note = (f"{models} CP-SAT models over {len(outcomes)} device sets, {size.variables} variables and "
            f"{size.constraints} constraints in all, slowest solve {max(solve_s, default=0.0):.3f} s; "
            f"model T_mb within {error:.3g} s of the true T_mb (time unit rounding, [Q9])")
    if best is None:
        status = SolveStatus.infeasible if complete else SolveStatus.unknown
        why = memory_proof(problem) or "no ring of any device set fits in memory (every CP-SAT model infeasible)"
        res = result(NAME, problem, start, None, status, why if complete else note)
    else:
        status = SolveStatus.optimal if complete else SolveStatus.feasible
        res = result(NAME, problem, start, best, status, note, bound=min(bound, best[0]))
    return res.model_copy(update={"model_size": size})
