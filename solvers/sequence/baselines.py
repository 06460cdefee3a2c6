"""Homogeneous baselines for sequence plans (issue: what Megatron CP / USP run).

A *uniform* layout is what a careful user runs by hand on a symmetric system (DeepSpeed-
Ulysses, ring attention, Megatron CP): D equal replicas of batch B/D, each a ring of G equal
groups of n members, every member with a/n heads and s/(G·n) tokens (§7.1), n dividing the
kv heads k and D the micro-batches B/b.

- `seq-uniform`: the best uniform layout over any device set a user would try, like the
  layered `symmetric` (which may idle devices): the whole cluster in file order, and for each
  set of GPU types (the fastest t types, t = 1, 2, …, and each type alone) its machines,
  fastest type first, so that a layout using fewer devices drops the slowest machines. The
  groups are either consecutive devices of that order or blocks of n inside one machine
  (a machine's leftover devices idle, as Megatron's tp blocks). Every n, D and every G that
  the token blocks allow is priced; the fastest that fits wins.
- `seq-uniform-all`: the old `seq-uniform`, kept as the report's earlier reference: the whole
  cluster in file order, the largest G that the devices and token blocks allow for each (n, D),
  so every type (the slowest sets the pace of an equal shard) takes part.
- `seq-roundrobin`: `seq-uniform-all`'s shapes with the devices dealt round-robin over the
  machines (device 0 of every machine, then device 1, …): topology-blind placement, so HP
  groups and ring neighbours sit on different machines (HexiSeq's cross-machine traffic
  comparison).

Each prices every layout with the planner (`plan_time`, §7.2–§7.3) and keeps the fastest that
fits in memory, trying layouts in a fixed order (deterministic; after the time limit it stops
at the best found so far); `unknown` when none fits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from planner.cost import attention_flops_per_token, matrix_flops_per_token
from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.sequence.space import Ring, mixes_vendors, plan_time, result, vendor_of_devices
from planner.base import plural

Block = tuple[int, ...]  # the devices of one group, in member order


def file_order(problem: Problem) -> list[int]:
    return list(range(problem.cluster.num_devices))


def round_robin_order(problem: Problem) -> list[int]:
    """Device j of every machine before device j+1 of any."""
    cluster = problem.cluster
    per = [cluster.devices_of(m) for m in range(len(cluster.machines))]
    return [devs[j] for j in range(max(len(p) for p in per)) for devs in per if j < len(devs)]


def splits_tokens(problem: Problem, groups: int, degree: int) -> bool:
    """Whether s/G is a multiple of 2q and s/(G·n) of q (§7.1 rules 2–3 for equal shards)."""
    s, q = problem.training.seq_len, problem.training.token_block
    return s % (groups * 2 * q) == 0 and (s // groups) % (degree * q) == 0


def largest_groups(problem: Problem, devices: int, replicas: int, degree: int) -> int:
    """The largest G with D·G·n ≤ devices whose shards split into token blocks (0: none)."""
    for g in range(devices // (replicas * degree), 0, -1):
        if splits_tokens(problem, g, degree):
            return g
    return 0


def packed_blocks(order: list[int], degree: int) -> list[Block]:
    """Consecutive groups of n devices of `order` (a group may span machines)."""
    return [tuple(order[i:i + degree]) for i in range(0, len(order) - degree + 1, degree)]


def machine_blocks(problem: Problem, order: list[int], degree: int) -> list[Block]:
    """Groups of n devices of one machine each, machines as they first appear in `order`;
    a machine's devices beyond a multiple of n stay idle."""
    machine_of = problem.cluster.machine_of_device
    by_machine: dict[int, list[int]] = {}
    for d in order:
        by_machine.setdefault(int(machine_of[d]), []).append(d)
    return [block for devices in by_machine.values() for block in packed_blocks(devices, degree)]


def uniform_rings(problem: Problem, blocks: list[Block], replicas: int, groups: int) -> list[Ring] | None:
    """D replicas of the next G blocks each, a/n heads and s/(G·n) tokens per member; None if
    a group mixes vendors (§8: the all-to-all has no cross-vendor route)."""
    vendors = vendor_of_devices(problem)
    degree = len(blocks[0])
    heads, tokens = problem.model.heads // degree, problem.training.seq_len // (groups * degree)
    if any(mixes_vendors([vendors[d] for d in block]) for block in blocks[:replicas * groups]):
        return None
    return [[[(d, heads, tokens) for d in blocks[r * groups + g]] for g in range(groups)]
            for r in range(replicas)]


def shapes(problem: Problem) -> Iterator[tuple[int, int]]:
    """(n, D): n dividing the kv heads k, D the micro-batches B/b."""
    model, training = problem.model, problem.training
    micro = training.global_batch // training.micro_batch
    for degree in (h for h in range(1, model.num_kv_heads + 1) if model.num_kv_heads % h == 0):
        for replicas in (d for d in range(1, micro + 1) if micro % d == 0):
            yield degree, replicas


def type_ranking(problem: Problem) -> list[str]:
    """The cluster's GPU types, fastest first: least compute time per token of one layer
    (F_mm/π + F_att/π_att, §7.2); ties keep file order."""
    cluster, model = problem.cluster, problem.model
    names = list(dict.fromkeys(m.gpu for m in cluster.machines))
    f_mm, f_att = matrix_flops_per_token(model), attention_flops_per_token(model, problem.training.seq_len)

    def token_time(name: str) -> float:
        gpu = cluster.catalog[name]
        return f_mm / gpu.effective_flops + f_att / gpu.effective_attention_flops

    return sorted(names, key=token_time)


def type_sets(problem: Problem) -> list[tuple[str, ...]]:
    """The GPU-type sets a user would try: the fastest t types for every t, then each type alone."""
    ranked = type_ranking(problem)
    sets = [tuple(ranked[:t]) for t in range(1, len(ranked) + 1)]
    return sets + [(name,) for name in ranked[1:]]


def device_orders(problem: Problem) -> list[list[int]]:
    """The whole cluster in file order (`seq-uniform-all`'s order), then per type set its
    devices, fastest type first and machines in file order: a prefix drops the slowest."""
    cluster = problem.cluster
    rank = {name: i for i, name in enumerate(type_ranking(problem))}
    machines = sorted(range(len(cluster.machines)), key=lambda m: rank[cluster.machines[m].gpu])
    orders = [file_order(problem)]
    for kept in type_sets(problem):
        orders.append([d for m in machines if cluster.machines[m].gpu in kept for d in cluster.devices_of(m)])
    return orders


def subset_layouts(problem: Problem) -> Iterator[tuple[tuple[int, int, int], list[Ring]]]:
    """Every distinct uniform layout over the device orders: ((n, D, G), rings)."""
    seen: set[tuple] = set()
    for order in device_orders(problem):
        for degree, replicas in shapes(problem):
            for blocks in (packed_blocks(order, degree), machine_blocks(problem, order, degree)):
                for groups in range(len(blocks) // replicas, 0, -1):
                    key = (replicas, groups, tuple(blocks[:replicas * groups]))
                    if key in seen or not splits_tokens(problem, groups, degree):
                        continue
                    seen.add(key)
                    rings = uniform_rings(problem, blocks, replicas, groups)
                    if rings is not None:
                        yield (degree, replicas, groups), rings


def all_device_layouts(problem: Problem, order: list[int]) -> Iterator[tuple[tuple[int, int, int], list[Ring]]]:
    """`seq-uniform-all`'s layouts: per (n, D) the largest G, devices taken in `order`."""
    for degree, replicas in shapes(problem):
        groups = largest_groups(problem, len(order), replicas, degree)
        rings = uniform_rings(problem, packed_blocks(order, degree), replicas, groups) if groups else None
        if rings is not None:
            yield (degree, replicas, groups), rings


def best_layout(name: str, problem: Problem, layouts, deadline: float) -> SolveResult:
    """The fastest layout that fits, priced by the planner; after `deadline` the best so far."""
    start = time.perf_counter()
    best, tried = None, 0
    for shape, rings in layouts:
        if best is not None and time.perf_counter() > deadline:
            break
        replicas = shape[1]
        batches = [problem.training.global_batch // replicas] * replicas
        t, fits = plan_time(problem, batches, rings)
        tried += 1
        if fits and (best is None or t < best[0]):
            best = (t, batches, rings, shape)
    if best is None:
        return result(name, problem, start, None, SolveStatus.unknown,
                      f"none of the {tried} uniform layouts (n, D, G) fits in memory")
    (h, d, g), used = best[3], sorted({m[0] for ring in best[2] for group in ring for m in group})
    types = ", ".join(dict.fromkeys(problem.cluster.gpu_of(int(problem.cluster.machine_of_device[x])).name
                                    for x in used))
    return result(name, problem, start, best[:3], SolveStatus.feasible,
                  f"HP degree {h}, {plural(d, 'replica')} of {plural(g, 'group')}, {d * g * h} of {problem.cluster.num_devices} "
                  f"devices ({types}); best of {tried} layouts")


def solve_uniform(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The best uniform layout over the device sets a user would try (slow types may idle)."""
    options = options or SolverOptions()
    return best_layout("seq-uniform", problem, subset_layouts(problem), time.perf_counter() + options.time_limit_s)


def solve_uniform_all(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The best uniform layout over the whole cluster in file order (the old `seq-uniform`)."""
    options = options or SolverOptions()
    return best_layout("seq-uniform-all", problem, all_device_layouts(problem, file_order(problem)),
                       time.perf_counter() + options.time_limit_s)


def solve_roundrobin(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    options = options or SolverOptions()
    return best_layout("seq-roundrobin", problem, all_device_layouts(problem, round_robin_order(problem)),
                       time.perf_counter() + options.time_limit_s)
