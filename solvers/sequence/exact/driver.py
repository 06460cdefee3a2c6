"""The outer loop shared by the exact sequence solvers (CP-SAT and MILP): docs/formulation.md
§7.1 "Outside the model" and §7.1.1.

Every used device set and its split into replicas [B1]; the best ring of each replica's [S1]
key, found once by the solver's own `best_ring(problem, key, deadline, threads)` and moved
onto the replica's devices; the exact batch split on the re-priced T_mb; T_dp; the plan priced
whole by the planner (a memory mismatch raises). The proven bound is the least, over the
splits whose replicas all have some ring, of the batch split on the keys' T_mb bounds plus T_dp.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from planner.problem import Problem
from planner.sequence.rules import no_token_layout
from planner.solver_info import SolveStatus
from solvers.common import ModelSize, SolveResult, SolverOptions
from solvers.sequence.brute import set_partitions
from solvers.sequence.exact.model import shard_units
from solvers.sequence.exact.structure import Key, key_of, rename
from solvers.sequence.space import dp_time, memory_proof, plan_time, result, split_batches
from planner.base import plural

MAX_DEVICES, MAX_UNITS = 6, 512


@dataclass
class SetOutcome:
    """The best ring of one [S1] key: its ring on the canonical devices and true T_mb, a
    proven lower bound on T_mb (inf: no ring fits), whether every model finished."""

    ring: list | None = None
    tmb: float = math.inf
    bound: float = math.inf
    complete: bool = True
    error_s: float = 0.0  # E·unit of [Q9] (0 for the MILP)
    models: int = 0
    variables: int = 0
    constraints: int = 0
    solve_s: list = field(default_factory=list)


BestRing = Callable[[Problem, Key, float, int], SetOutcome]


def too_big(problem: Problem) -> str | None:
    n, units = problem.cluster.num_devices, shard_units(problem)
    if n > MAX_DEVICES or units > MAX_UNITS:
        return (f"the exact sequence model handles ≤ {MAX_DEVICES} devices and ≤ {MAX_UNITS} shard units "
                f"s/(2q); this problem has {plural(n, 'device')} and {units} units")
    return None


def replica_splits(problem: Problem):
    """[B1] every used device set and its split into replicas (≤ B/b of them)."""
    n, micro = problem.cluster.num_devices, problem.training.global_batch // problem.training.micro_batch
    for used in range(1, n + 1):
        for subset in itertools.combinations(range(n), used):
            for replicas in set_partitions(subset):
                if len(replicas) <= micro:
                    yield replicas


def least_max(micro: int, tmb: list[float]) -> tuple[float, list[int]]:
    """min over every split m_r ≥ 1, Σ m_r = M, of max_r m_r·T_mb(r), and that split (the
    heuristic's exact split, `space.split_batches`, at any M; brute force enumerates every split:
    tests hold the two equal; B/b = 10⁸ had filled 12 GB)."""
    split = split_batches(micro, tmb)
    return max(m * t for m, t in zip(split, tmb)), split


def combine(problem: Problem, outcomes: dict, replicas, best, bound: float, label: str):
    """T and the proven bound of one replica split [B1]: batches split exactly, T_dp added."""
    training = problem.training
    micro = training.global_batch // training.micro_batch
    found = [outcomes[key_of(problem, r)] for r in replicas]
    if any(math.isinf(f.bound) for f in found):
        return best, bound  # a replica's devices hold no ring: proven by its models
    dp = dp_time(problem, [[[(d, 1, 1) for d in r]] for r in replicas])
    bound = min(bound, least_max(micro, [f.bound for f in found])[0] + dp)
    if any(f.ring is None for f in found):
        return best, bound
    _, m = least_max(micro, [f.tmb for f in found])
    batches = [x * training.micro_batch for x in m]
    rings = [rename(problem, f.ring, r) for f, r in zip(found, replicas)]
    t, fits = plan_time(problem, batches, rings)
    if not fits:
        raise AssertionError(f"{label} plan {rings} does not fit in memory when priced whole")
    return (best if best is not None and best[0] <= t else (t, batches, rings)), bound


def solve_exact(problem: Problem, options: SolverOptions | None, name: str, label: str,
                best_ring: BestRing, note_of: Callable[[dict], str]) -> SolveResult:
    """The optimum over the whole §7.1 space of a small problem, rings found by `best_ring`."""
    options = options or SolverOptions()
    start = time.perf_counter()
    if (why := too_big(problem)) is not None:
        return SolveResult(solver=name, status=SolveStatus.unknown, wall_s=0.0, message=why)
    if (why := no_token_layout(problem)) is not None:
        return SolveResult(solver=name, status=SolveStatus.infeasible, wall_s=0.0, message=why)
    deadline = start + options.time_limit_s
    outcomes: dict[Key, SetOutcome] = {}
    best, bound = None, math.inf
    for replicas in replica_splits(problem):
        for r in replicas:
            key = key_of(problem, r)
            if key not in outcomes:
                outcomes[key] = best_ring(problem, key, deadline, options.threads)
        best, bound = combine(problem, outcomes, replicas, best, bound, label)
    return finish(problem, name, label, start, outcomes, best, bound, note_of(outcomes))


def model_size(outcomes: dict) -> ModelSize:
    return ModelSize(variables=sum(o.variables for o in outcomes.values()),
                     constraints=sum(o.constraints for o in outcomes.values()))


def finish(problem: Problem, name: str, label: str, start: float, outcomes: dict, best, bound: float,
           note: str) -> SolveResult:
    """Status, plan and bound of the whole solve."""
    complete = all(o.complete for o in outcomes.values())
    if best is None:
        status = SolveStatus.infeasible if complete else SolveStatus.unknown
        why = memory_proof(problem) or f"no ring of any device set fits in memory (every {label} model infeasible)"
        res = result(name, problem, start, None, status, why if complete else note)
    else:
        status = SolveStatus.optimal if complete else SolveStatus.feasible
        res = result(name, problem, start, best, status, note, bound=min(bound, best[0]))
    return res.model_copy(update={"model_size": model_size(outcomes)})
