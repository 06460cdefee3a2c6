"""Rings for the keys the configuration bound picks (docs/sequence_bounds.md §4): exact where
the key is small (`solvers.sequence.exact.milp.best_ring`, a proven least T_mb, which then
replaces the key's bound), else the default heuristic's best single replica on the key's
devices (a ring, not a bound). Rings are kept on the key's canonical devices and moved onto
the devices a configuration hands each replica."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from planner.hardware import Cluster
from planner.problem import Problem
from solvers.common import SolverOptions
from solvers.sequence import heuristic
from solvers.sequence.exact import driver, milp
from solvers.sequence.exact.model import shard_units
from solvers.sequence.exact.structure import rename
from solvers.sequence.space import Ring

EXACT_KEY_DEVICES = 4  # keys up to this size get the exact MILP ring (and their exact T_mb)
SUB_LIMIT_S = 10.0  # the heuristic's time on one key, at most


@dataclass(frozen=True)
class KeyRing:
    """What is known of one key beyond its bound: a ring on its canonical devices (None:
    none found), that ring's T_mb, and a proven lower bound on T_mb (the exact MILP's)."""

    ring: Ring | None
    tmb: float
    bound_s: float  # -inf when only the heuristic ran
    exact: bool


def key_problem(problem: Problem, key) -> tuple[Problem, list[int]]:
    """The problem on the key's devices only with one micro-batch per iteration (a single
    replica), and each of its device ids' canonical device in `problem`."""
    cluster = problem.cluster
    kept = [m for m, c in enumerate(key) if c]
    names = {cluster.machines[m].name for m in kept}
    data = cluster.model_dump()
    data["machines"] = [data["machines"][m] | {"count": int(key[m])} for m in kept]
    data["links"] = [link for link in data["links"] if link["a"] in names and link["b"] in names]
    data["racks"] = [rack | {"machines": [n for n in rack["machines"] if n in names]} for rack in data["racks"]
                     if sum(n in names for n in rack["machines"]) >= 2]
    training = problem.training.model_copy(update={"global_batch": problem.training.micro_batch})
    sub = problem.model_copy(update={"cluster": Cluster.model_validate(data), "training": training,
                                     "name": f"{problem.name}-key"})
    devices = [d for m in kept for d in cluster.devices_of(m)[:int(key[m])]]
    return Problem.model_validate(sub.model_dump()), devices


def exact_ring(problem: Problem, key, deadline: float, threads: int) -> KeyRing:
    out = milp.best_ring(problem, tuple(int(c) for c in key), deadline, threads)
    bound = out.bound if out.complete else -math.inf
    return KeyRing(out.ring, out.tmb, bound, out.complete)


def heuristic_ring(problem: Problem, key, deadline: float, seed: int) -> KeyRing:
    sub, devices = key_problem(problem, key)
    limit = max(0.5, min(SUB_LIMIT_S, deadline - time.perf_counter()))
    res = heuristic.solve(sub, SolverOptions(time_limit_s=limit, seed=seed))
    if res.plan is None:
        return KeyRing(None, math.inf, -math.inf, False)
    ring = [[(devices[m.device], m.heads, m.tokens) for m in g.members] for g in res.plan.replicas[0].ring]
    return KeyRing(ring, float(res.objective_s), -math.inf, False)


def small_enough(problem: Problem, key) -> bool:
    return int(np.sum(key)) <= EXACT_KEY_DEVICES and shard_units(problem) <= driver.MAX_UNITS


def ring_of(problem: Problem, key, deadline: float, options: SolverOptions) -> KeyRing:
    """The exact ring of a small key, else the heuristic's."""
    if small_enough(problem, key):
        return exact_ring(problem, key, deadline, options.threads)
    return heuristic_ring(problem, key, deadline, options.seed)


def place(problem: Problem, keys: list, rings: list[Ring]) -> list[Ring]:
    """Each key's ring moved onto its own devices: the replicas take every machine's devices
    in turn (the keys fit the cluster together)."""
    cluster, taken = problem.cluster, [0] * len(problem.cluster.machines)
    placed = []
    for key, ring in zip(keys, rings):
        own = []
        for m, c in enumerate(key):
            own += cluster.devices_of(m)[taken[m]:taken[m] + int(c)]
            taken[m] += int(c)
        placed.append(rename(problem, ring, own))  # a ring on fewer devices takes the first ones
    return placed
