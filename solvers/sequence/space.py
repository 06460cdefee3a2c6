"""What the sequence solvers share: rings as plain lists, their pricing through the planner,
the batch split, the memory proof of infeasibility and the result.

A *ring* is a list of groups in ring order, a group a list of `(device, heads, tokens)`
(docs/sequence-plans.md §7.1). Every term of §7.2–§7.3 except T_dp depends only on one replica's own
ring (its m_r multiplies T_mb), so many rings are priced at once as the replicas of one
`MemberTable` with batch b each: `ring_times` gives T_mb and the memory fit of each. The
returned plan is always priced whole by `planner.sequence.iteration_time`.
"""

from __future__ import annotations

import gc
import itertools
import time
from contextlib import contextmanager
from collections.abc import Sequence

import numpy as np

from planner.base import GIB
from planner.problem import Problem
from planner.sequence import MemberTable, SeqPlan, iteration_time
from planner.sequence import cost
from planner.sequence import pricing
from planner.sequence.links import Units, across_sets
from planner.sequence.pricing import memory_parts
from planner.solver_info import SolverInfo, SolveStatus
from solvers.batch_split import greedy_increments
from solvers.common import SolveResult
from planner.base import plural

MemberSpec = tuple[int, int, int]
Ring = list[list[MemberSpec]]


def compositions(total: int, parts: int):
    """Every tuple of `parts` positive integers summing to `total`."""
    if parts < 1 or total < parts:
        return
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0, *cuts), (*cuts, total)))


def table_of(rings: Sequence[Ring], batches: Sequence[int]) -> MemberTable:
    members = [m for ring in rings for g in ring for m in g]
    return MemberTable.from_arrays(
        [m[0] for m in members], [m[1] for m in members], [m[2] for m in members],
        [len(g) for ring in rings for g in ring], [len(ring) for ring in rings], batches)


def micro_batch_times(problem: Problem, table: MemberTable) -> np.ndarray:
    """T_mb of every replica of `table`: `planner.sequence.pricing.time_parts` without its
    last step, T_dp across the replicas (which the candidates priced together as replicas
    do not have; tests check the two agree)."""
    model, training = problem.model, problem.training
    machine = problem.cluster.machine_of_device[table.device]
    linear, attention, head, _ = pricing._member_compute(problem, table, machine)
    units = Units.of(len(problem.cluster.machines), table.group, machine, table.num_groups)
    _, _, qkv, out = pricing._hp_exchanges(problem, table, units)
    _, _, ring = pricing._ring(problem, table, units)
    members, groups = table.member_start, table.ring_start
    per = lambda x, starts: np.maximum.reduceat(x, starts[:-1])  # noqa: E731
    layer = cost.layer_time(training, per(linear, members), per(qkv + out, groups), per(attention, members),
                            per(ring, members))
    _, _, zero_layer, zero_ends = pricing._zero(problem, table, machine)
    return cost.micro_batch_time(model, layer, zero_layer, per(head, members), zero_ends)


def ring_overflow(problem: Problem, rings: Sequence[Ring]) -> tuple[np.ndarray, np.ndarray]:
    """T_mb of each ring (as a replica of one micro-batch) and its largest memory overflow in
    bytes (≤ 0: it fits). Rings may share devices: each is priced as if alone (rules 1–4 are
    the caller's)."""
    return table_overflow(problem, table_of(rings, [problem.training.micro_batch] * len(rings)))


def table_overflow(problem: Problem, table: MemberTable) -> tuple[np.ndarray, np.ndarray]:
    """`ring_overflow` of the replicas of a table built by the caller."""
    tmb = micro_batch_times(problem, table)
    mem = memory_parts(problem, table)
    return tmb, np.maximum.reduceat(mem.total - mem.capacity, table.member_start[:-1])


def ring_times(problem: Problem, rings: Sequence[Ring]) -> tuple[np.ndarray, np.ndarray]:
    """T_mb of each ring and whether it fits in memory."""
    tmb, over = ring_overflow(problem, rings)
    return tmb, over <= 0


def plan_of(problem: Problem, batches: Sequence[int], rings: Sequence[Ring]) -> SeqPlan:
    return SeqPlan.from_rings(problem=problem.name, batches=list(batches), rings=list(rings))


def plan_time(problem: Problem, batches: Sequence[int], rings: Sequence[Ring]) -> tuple[float, bool]:
    """T of the whole plan and whether every member fits in memory."""
    table = table_of(rings, batches)
    mem = memory_parts(problem, table)
    return iteration_time(problem, table, check=False), bool((mem.total <= mem.capacity).all())


def dp_time(problem: Problem, rings: Sequence[Ring]) -> float:
    """T_dp of replicas with these rings (0 for one replica)."""
    if len(rings) < 2:
        return 0.0
    table = table_of(rings, [problem.training.micro_batch] * len(rings))
    machine = problem.cluster.machine_of_device[table.device]
    bw, lat = across_sets(problem.cluster, table.replica, machine, table.num_replicas)
    return float(cost.dp_time(problem.model, problem.training, table.num_replicas, table.replica_size.min(), bw, lat))


GREEDY_SPLIT = 64  # micro-batches handed out by the plain greedy loop, at most (else `greedy_increments`)


def split_batches(micro_batches: int, tmb: Sequence[float]) -> list[int] | None:
    """m_r ≥ 1 with Σ m_r = M minimising max_r m_r·T_mb(r): one micro-batch at a time to the
    replica whose time after it is least (optimal for identical jobs on uniform machines).
    Large splits find the same m_r without the loop (`solvers.batch_split`, the layered
    pipelines' split: base = step = T_mb; thousands of micro-batches and replicas at 16k+ GPUs
    made the loop take seconds)."""
    if len(tmb) > micro_batches:
        return None
    extra = micro_batches - len(tmb)
    t = np.asarray(tmb, dtype=float)
    if extra <= GREEDY_SPLIT or not (np.isfinite(t).all() and (t > 0).all()):
        return _greedy_split(micro_batches, list(tmb))
    return (1 + greedy_increments(t, t, extra)).tolist()


def _greedy_split(micro_batches: int, tmb: list[float]) -> list[int]:
    m = [1] * len(tmb)
    for _ in range(micro_batches - len(tmb)):
        r = min(range(len(tmb)), key=lambda i: ((m[i] + 1) * tmb[i], i))
        m[r] += 1
    return m


_LAST: dict[str, tuple[object, object]] = {}  # per-cluster figures of the last cluster asked


def per_cluster(what: str, problem: Problem, compute):
    """`compute(cluster)`, kept for the cluster last asked about (solvers ask thousands of times)."""
    cluster = problem.cluster
    held = _LAST.get(what)
    if held is None or held[0] is not cluster:
        held = (cluster, compute(cluster))
        _LAST[what] = held
    return held[1]


def _vendors(cluster) -> list[str]:
    vendor = [cluster.gpu_of(m).vendor.value for m in range(len(cluster.machines))]
    return [vendor[int(m)] for m in cluster.machine_of_device]


def vendor_of_devices(problem: Problem) -> list[str]:
    return per_cluster("vendor", problem, _vendors)


def mixes_vendors(vendors: Sequence[str]) -> bool:
    return "nvidia" in vendors and "amd" in vendors


def least_memory(problem: Problem, replica_devices: int) -> float:
    """A lower bound on any member's memory in a replica of `replica_devices` devices: its
    states shard, the gathered weights, the reserve and the activations and logits of the
    smallest member (t_i = q, T_g = 2q, heads a/k, one group: no ring buffers)."""
    model, training = problem.model, problem.training
    q, per_kv = training.token_block, model.heads // model.num_kv_heads
    working = cost.working_set_bytes(model, training, q, 2 * q, per_kv)
    return float(cost.state_bytes(model, training, replica_devices) + cost.gathered_bytes(model, training)
                 + cost.activation_bytes(model, training, q, working) + cost.logits_bytes(model, training, q)
                 + cost.reserve_bytes(training))


def memory_proof(problem: Problem) -> str | None:
    """Why no plan fits, when §7.3 proves it: a replica of n devices needs n devices that
    each hold `least_memory(n)`; if no n has them, no plan exists. None when not proved."""
    capacity = problem.cluster.machine_memory_bytes[problem.cluster.machine_of_device]
    n_all = len(capacity)
    for n in range(1, n_all + 1):
        if int((capacity >= least_memory(problem, n)).sum()) >= n:
            return None
    return (f"no replica fits in memory: even with all {plural(n_all, 'device')} in one replica each needs at least "
            f"{least_memory(problem, n_all) / GIB:.2f} GiB (states, gathered weights, reserve, one token "
            f"block), the largest device has {capacity.max() / GIB:.2f} GiB")


@contextmanager
def paused_gc():
    """No garbage collection inside: building a plan of 20,000 members (a pydantic object
    each) otherwise runs full collections over the solver's heap (0.3 s became 0.6 s)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def result(name: str, problem: Problem, start: float, best: tuple[float, list[int], list[Ring]] | None,
           status: SolveStatus, message: str = "", bound: float | None = None) -> SolveResult:
    """The SolveResult of `best` = (T, batches, rings), priced again whole."""
    wall = time.perf_counter() - start
    if best is None:
        return SolveResult(solver=name, status=status, wall_s=wall, message=message)
    _, batches, rings = best
    with paused_gc():
        plan = plan_of(problem, batches, rings)
    t = iteration_time(problem, plan)
    plan = plan.model_copy(update={"solver": SolverInfo(
        name=name, status=status, objective_s=t, bound_s=bound, wall_s=wall)})
    return SolveResult(solver=name, status=status, plan=plan, objective_s=t, bound_s=bound,
                       wall_s=wall, message=message)
