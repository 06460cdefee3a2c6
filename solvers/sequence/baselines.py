"""Homogeneous baselines for sequence plans (issue: what Megatron CP / USP run).

- `seq-uniform`: every replica the same, every group the same — D replicas of G groups of h
  members, devices taken in file order, equal tokens s/G per group and s/(G·h) per member,
  equal heads a/h, equal batches B/D, ring in file order; the best over h (dividing k) and D,
  G the largest that the devices and the token blocks allow.
- `seq-roundrobin`: the same shapes with the devices dealt round-robin over the machines
  (device 0 of every machine, then device 1, …): topology-blind placement, so HP groups and
  ring neighbours sit on different machines (HexiSeq's cross-machine traffic comparison).

Both price every shape with the planner and keep the fastest that fits; `unknown` when none fits.
"""

from __future__ import annotations

import time

from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.sequence.space import Ring, mixes_vendors, plan_time, result, vendor_of_devices


def file_order(problem: Problem) -> list[int]:
    return list(range(problem.cluster.num_devices))


def round_robin_order(problem: Problem) -> list[int]:
    """Device j of every machine before device j+1 of any."""
    cluster = problem.cluster
    per = [cluster.devices_of(m) for m in range(len(cluster.machines))]
    return [devs[j] for j in range(max(len(p) for p in per)) for devs in per if j < len(devs)]


def largest_groups(problem: Problem, devices: int, replicas: int, degree: int) -> int:
    """The largest G with D·G·h ≤ devices, s/G a multiple of 2q and s/(G·h) of q (0: none)."""
    s, q = problem.training.seq_len, problem.training.token_block
    for g in range(devices // (replicas * degree), 0, -1):
        if s % (g * 2 * q) == 0 and (s // g) % (degree * q) == 0:
            return g
    return 0


def uniform_rings(problem: Problem, order: list[int], replicas: int, degree: int, groups: int) -> list[Ring] | None:
    """D replicas of G groups of h members in `order`; None if a group mixes vendors."""
    model, s = problem.model, problem.training.seq_len
    vendors = vendor_of_devices(problem)
    heads, tokens = model.heads // degree, s // (groups * degree)
    rings, at = [], 0
    for _ in range(replicas):
        ring = []
        for _ in range(groups):
            members = order[at:at + degree]
            at += degree
            if mixes_vendors([vendors[d] for d in members]):
                return None
            ring.append([(d, heads, tokens) for d in members])
        rings.append(ring)
    return rings


def best_uniform(name: str, problem: Problem, order: list[int], deadline: float) -> SolveResult:
    start = time.perf_counter()
    model, training = problem.model, problem.training
    micro = training.global_batch // training.micro_batch
    best = None
    for degree in (h for h in range(1, model.num_kv_heads + 1) if model.num_kv_heads % h == 0):
        for replicas in (d for d in range(1, micro + 1) if micro % d == 0):
            groups = largest_groups(problem, len(order), replicas, degree)
            rings = uniform_rings(problem, order, replicas, degree, groups) if groups else None
            if rings is None or (best is not None and time.perf_counter() > deadline):
                continue
            batches = [training.global_batch // replicas] * replicas
            t, fits = plan_time(problem, batches, rings)
            if fits and (best is None or t < best[0]):
                best = (t, batches, rings, (degree, replicas, groups))
    if best is None:
        return result(name, problem, start, None, SolveStatus.unknown,
                      "no uniform shape (h, D, G) fits in memory")
    h, d, g = best[3]
    return result(name, problem, start, best[:3], SolveStatus.feasible,
                  f"HP degree {h}, {d} replicas of {g} groups, {d * g * h} devices")


def solve_uniform(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    options = options or SolverOptions()
    return best_uniform("seq-uniform", problem, file_order(problem), time.perf_counter() + options.time_limit_s)


def solve_roundrobin(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    options = options or SolverOptions()
    return best_uniform("seq-roundrobin", problem, round_robin_order(problem),
                        time.perf_counter() + options.time_limit_s)
