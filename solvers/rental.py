"""Which machines to rent (docs/prices.md §13): machine sets under a budget, the problem
restricted to one set, and a plan of that smaller problem written back in the whole cluster's ids.

A plan that uses only the machines of a set S is a plan of the problem restricted to S with the
same T (every §3 and §7 term reads only the devices a plan uses and the links between their
machines), and it rents at most rent(S). So the best plan under a budget is the best plan of the
best set among the *maximal affordable* ones (no machine can be added within the budget), and
the cheapest cost per token is the least rent(S)·T*(S) over all sets: this is how the solvers that
have no rent of their own (the heuristics, the baselines, the sequence exact solvers) honour an
objective (`solvers.objective`).

Two ways to list sets:
- exactly (`maximal_sets`, `rent_levels`): machines are grouped into classes of truly
  interchangeable ones (same GPU type, count, price, intra figures and rack, no link overrides),
  and every count vector over the classes is one set (its class's first machines); a class's
  machines are interchangeable, so this keeps every optimum. Small clusters only.
- as candidates for a heuristic (`candidate_sets`): machines grouped into offers (one GPU type at
  one price, one machine size), each offer's machines in a fixed order (machines
  without slow link overrides, then file order, which keeps racks together); a set takes a prefix
  of each offer. Count vectors are ranked by the compute they buy (Σ π over their devices),
  as the budget allows, and the best of each mix of offers is kept for diversity.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from planner.cost import machine_usable_bytes
from planner.hardware import Cluster
from planner.layered import cost
from planner.prices import rented_machines, spendable
from planner.problem import Objective, Problem

ENUMERATE_LIMIT = 200_000  # count vectors enumerated at most; beyond, greedy fills
EXACT_LIMIT = 4096  # exact set lists are refused beyond this many count vectors
NOISE = 1e-12  # relative: rents that differ by less are one rent (float sums of the same prices)


@dataclass(frozen=True)
class MachineGroups:
    """Machines in groups (each in pick order) with per-machine rent, compute and usable memory."""

    groups: tuple[tuple[int, ...], ...]
    rent: np.ndarray  # per machine, per hour
    flops: np.ndarray  # per machine: count · max(π, π_att)
    memory: np.ndarray  # per machine: count · (memory − reserve), bytes

    @property
    def sizes(self) -> list[int]:
        return [len(g) for g in self.groups]

    def prefix(self, values: np.ndarray) -> list[np.ndarray]:
        """Per group, the sum of `values` over its first k machines, k = 0..size."""
        return [np.concatenate([[0.0], np.cumsum(values[list(g)])]) for g in self.groups]

    def machines_of(self, counts) -> tuple[int, ...]:
        """The set a count vector names: each group's first k machines."""
        return tuple(sorted(m for g, k in zip(self.groups, counts) for m in g[:int(k)]))


def _per_machine(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cluster = problem.cluster
    fastest = np.maximum(cluster.machine_flops, cluster.machine_attention_flops)
    usable = machine_usable_bytes(cluster, problem.training)
    return cluster.machine_rent.astype(float), cluster.machine_counts * fastest, usable


def exact_classes(problem: Problem) -> MachineGroups:
    """Classes of interchangeable machines (see the module text), in file order."""
    cluster = problem.cluster
    linked = {name for link in cluster.links for name in (link.a, link.b)}
    classes: dict[tuple, list[int]] = defaultdict(list)
    for m, machine in enumerate(cluster.machines):
        alone = machine.name in linked
        key = (m,) if alone else (machine.gpu, machine.count, float(cluster.machine_prices[m]),
                                  float(cluster.machine_intra_bw[m]), float(cluster.machine_intra_lat[m]),
                                  int(cluster.machine_rack[m]))
        classes[key].append(m)
    return MachineGroups(tuple(tuple(g) for g in classes.values()), *_per_machine(problem))


def offers(problem: Problem) -> MachineGroups:
    """Machines by offer (GPU type, device price, machine size), each in pick order (module text)."""
    cluster = problem.cluster
    slow = _slow_linked(problem)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for m, machine in enumerate(cluster.machines):
        # the size too: a set may then rent a type's small machines without its large one
        # (gen64-s3 at 16.54/h: one 4-GPU H800 box beside the RTX 4090s, 11.5 s, against 18.4 s
        # when the H800 offer's prefix had to start with its 8-GPU box)
        groups[(machine.gpu, float(cluster.machine_prices[m]), machine.count)].append(m)
    ordered = [tuple(sorted(g, key=lambda m: (m in slow, m))) for g in groups.values()]
    return MachineGroups(tuple(ordered), *_per_machine(problem))


def _slow_linked(problem: Problem) -> set[int]:
    """Machines with a link override slower than the cluster's default inter bandwidth."""
    cluster = problem.cluster
    return {cluster.machine_index[name] for link in cluster.links if link.bw_gbps < cluster.inter_bw_gbps
            for name in (link.a, link.b)}


def count_vectors(groups: MachineGroups, limit: int) -> np.ndarray | None:
    """Every count vector over the groups (rows), or None when there are more than `limit`."""
    sizes = groups.sizes
    if float(np.prod([s + 1 for s in sizes], dtype=float)) > limit:
        return None
    grids = np.meshgrid(*[np.arange(s + 1) for s in sizes], indexing="ij")
    return np.stack([g.ravel() for g in grids], axis=1)


def totals(groups: MachineGroups, vectors: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Σ `values` over each count vector's machines."""
    out = np.zeros(len(vectors))
    for g, table in enumerate(groups.prefix(values)):
        out += table[vectors[:, g]]
    return out


def _maximal(groups: MachineGroups, vectors: np.ndarray, rents: np.ndarray, budget: float) -> np.ndarray:
    """Which affordable vectors are maximal: no group's next machine fits in what is left."""
    limit = spendable(budget)
    keep = rents <= limit
    for g, group in enumerate(groups.groups):
        nxt = np.append(groups.rent[list(group)], np.inf)[vectors[:, g]]
        keep &= rents + nxt > limit
    return keep


def holds_states(problem: Problem, memory: np.ndarray | float) -> np.ndarray | bool:
    """Whether machine sets with this usable memory can hold one replica's model states at all
    (μ·P: necessary for a plan of any kind)."""
    return np.asarray(memory) >= cost.model_state_bytes(problem.model, problem.training)


def maximal_sets(problem: Problem, budget: float) -> list[tuple[int, ...]]:
    """Every maximal affordable machine set up to interchangeable machines (exact; small clusters),
    those that can hold the model states at all, most compute first."""
    groups = exact_classes(problem)
    vectors = _exact_vectors(groups)
    rents = totals(groups, vectors, groups.rent)
    keep = _maximal(groups, vectors, rents, budget) & holds_states(problem, totals(groups, vectors, groups.memory))
    flops = totals(groups, vectors, groups.flops)
    order = [i for i in np.argsort(-flops, kind="stable") if keep[i] and vectors[i].any()]
    return [groups.machines_of(vectors[i]) for i in order]


def _exact_vectors(groups: MachineGroups) -> np.ndarray:
    vectors = count_vectors(groups, EXACT_LIMIT)
    if vectors is None:
        raise ValueError(f"too many machine sets to list exactly (more than {EXACT_LIMIT:,}); "
                         f"classes of interchangeable machines: {groups.sizes}")
    return vectors


def rent_levels(problem: Problem, budget: float | None = None) -> list[float]:
    """Every distinct rent per hour of a machine set that can hold the model states (ascending,
    at most `budget`): the only rents a plan can have (exact; small clusters)."""
    groups = exact_classes(problem)
    vectors = _exact_vectors(groups)
    rents = totals(groups, vectors, groups.rent)
    ok = holds_states(problem, totals(groups, vectors, groups.memory)) & vectors.any(axis=1)
    if budget is not None:
        ok &= rents <= spendable(budget)
    levels: list[float] = []
    for rent in sorted(float(r) for r in rents[ok]):
        # sums of the same prices in another order differ by float noise: one level, the larger, so
        # that it affords each such set (rounding to 9 decimals had cut $0.136986301369863 below
        # its own machine's rent by more than the budget's slack: that set was then unaffordable)
        if levels and rent <= levels[-1] * (1 + NOISE):
            levels[-1] = rent
        else:
            levels.append(rent)
    return levels


def most_compute_within(problem: Problem, budget: float) -> float:
    """The most Σ max(π, π_att) (FLOP/s) any machine set within `budget` buys (exact on small
    clusters; on large ones the whole cluster's, still an upper bound)."""
    groups = exact_classes(problem)
    vectors = count_vectors(groups, ENUMERATE_LIMIT)
    if vectors is None:
        return float(groups.flops.sum())
    ok = totals(groups, vectors, groups.rent) <= spendable(budget)
    return float(totals(groups, vectors, groups.flops)[ok].max(initial=0.0))


def candidate_sets(problem: Problem, budget: float, limit: int = 4) -> list[tuple[int, ...]]:
    """Up to `limit` machine sets for a heuristic under `budget` (module text): the affordable,
    maximal prefix vectors that can hold the model states, the most compute first, and then the
    best of each other mix of GPU types."""
    groups = offers(problem)
    vectors = count_vectors(groups, ENUMERATE_LIMIT)
    if vectors is None:
        vectors = _greedy_vectors(groups, budget)
    rents = totals(groups, vectors, groups.rent)
    keep = _maximal(groups, vectors, rents, budget) & holds_states(problem, totals(groups, vectors, groups.memory))
    keep &= vectors.any(axis=1)
    flops = totals(groups, vectors, groups.flops)
    chosen, mixes = [], set()
    for i in np.argsort(-flops, kind="stable"):
        mix = tuple(vectors[i] > 0)
        if keep[i] and (not chosen or mix not in mixes):
            chosen.append(groups.machines_of(vectors[i]))
            mixes.add(mix)
        if len(chosen) >= limit:
            break
    return chosen


def _greedy_vectors(groups: MachineGroups, budget: float) -> np.ndarray:
    """Count vectors by greedy fills when there are too many to list: groups taken in the order
    of each ranking (compute per unit of rent, compute per machine, memory per unit of rent, and
    every group alone), machines added while the budget allows."""
    rent, flops, memory = (np.array([v[list(g)].mean() for g in groups.groups]) for v in
                           (groups.rent, groups.flops, groups.memory))
    safe = np.maximum(rent, 1e-12)
    rankings = [np.argsort(-flops / safe), np.argsort(-flops), np.argsort(-memory / safe)]
    rankings += [np.array([g] + [h for h in np.argsort(-flops / safe) if h != g]) for g in range(len(rent))]
    rankings += [np.array([g]) for g in range(len(rent))]
    return np.array([_fill(groups, order, budget) for order in rankings])


def _fill(groups: MachineGroups, order, budget: float) -> list[int]:
    """Machines of the groups in `order`, each group's in pick order, while they fit the budget."""
    counts, left = [0] * len(groups.groups), spendable(budget)
    for g in order:
        for m in groups.groups[g]:
            if groups.rent[m] > left:
                break
            counts[g] += 1
            left -= groups.rent[m]
    return counts


def all_machines(problem: Problem) -> tuple[int, ...]:
    return tuple(range(len(problem.cluster.machines)))


def rent_of(problem: Problem, machines) -> float:
    return float(problem.cluster.machine_rent[list(machines)].sum())


def affords_everything(problem: Problem, budget: float) -> bool:
    """Whether `budget` rents every machine of the cluster (then it constrains no plan)."""
    return rent_of(problem, all_machines(problem)) <= spendable(budget)


def restricted(problem: Problem, machines) -> tuple[Problem, np.ndarray]:
    """The problem on `machines` only (same name; objective time, no budget: the caller applies
    them), and each new device id's id in `problem`. Links and racks keep the pairs among the
    kept machines, so every bandwidth between two kept devices is unchanged."""
    cluster, keep = problem.cluster, sorted(set(int(m) for m in machines))
    plain = problem.model_copy(update={"objective": Objective.time, "budget_per_hour": None})
    if len(keep) == len(cluster.machines):
        return plain, np.arange(cluster.num_devices)
    names = {cluster.machines[m].name for m in keep}
    data = cluster.model_dump()
    data["machines"] = [data["machines"][m] for m in keep]
    data["links"] = [link for link in data["links"] if link["a"] in names and link["b"] in names]
    data["racks"] = [rack | {"machines": [n for n in rack["machines"] if n in names]} for rack in data["racks"]
                     if sum(n in names for n in rack["machines"]) >= 2]
    smaller = plain.model_copy(update={"cluster": Cluster.model_validate(data)})
    new_to_old = np.concatenate([cluster.devices_of(m) for m in keep]).astype(np.int64)
    return smaller, new_to_old


def distinct_sets(problem: Problem, sets: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """One set of each restricted problem that is the same up to machine names: such sets have
    the same optimum, and a bound of one holds for the others. The listing keeps them apart
    where a machine's link to one *outside* the set differs (interchangeable machines have no
    link overrides, `exact_classes`); the restriction drops that link."""
    seen, kept = set(), []
    for machines in sets:
        key = _renamed_key(restricted(problem, machines)[0])
        if key not in seen:
            seen.add(key)
            kept.append(machines)
    return kept


def _renamed_key(problem: Problem) -> str:
    """The restricted cluster with machines named by position (file order, which restriction
    keeps): equal keys, equal problems up to names."""
    data = problem.cluster.model_dump()
    name = {m["name"]: f"m{i}" for i, m in enumerate(data["machines"])}
    for m in data["machines"]:
        m["name"] = name[m["name"]]
    for link in data["links"]:
        link["a"], link["b"] = name[link["a"]], name[link["b"]]
    for rack in data["racks"]:
        rack["machines"] = [name[n] for n in rack["machines"]]
    return json.dumps(data, sort_keys=True)


def lifted(plan, problem: Problem, new_to_old: np.ndarray):
    """A plan of a restricted problem written in `problem`'s device ids (either plan kind: every
    `devices` list and `device` field is renamed)."""
    data = _renamed(plan.model_dump(mode="json"), new_to_old)
    data["problem"] = problem.name
    return type(plan).model_validate(data)


def _renamed(value, new_to_old: np.ndarray):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "devices" and isinstance(item, list):
                out[key] = [int(new_to_old[d]) for d in item]
            elif key == "device" and isinstance(item, int):
                out[key] = int(new_to_old[item])
            else:
                out[key] = _renamed(item, new_to_old)
        return out
    if isinstance(value, list):
        return [_renamed(item, new_to_old) for item in value]
    return value


def least_rent_holding_states(problem: Problem, exact: bool = False) -> float | None:
    """The least rent per hour of a machine set with the memory for the model states (None when
    not even the whole cluster has it). `exact`: over every set up to interchangeable machines
    (ValueError when there are too many to list); else over the offers' prefixes when they can be
    listed, or machines by usable memory per unit of rent until the states fit (an estimate)."""
    groups = exact_classes(problem) if exact else offers(problem)
    vectors = count_vectors(groups, ENUMERATE_LIMIT)
    if vectors is None and exact:
        raise ValueError("too many machine sets to find the least rent exactly")
    if vectors is not None:
        ok = holds_states(problem, totals(groups, vectors, groups.memory)) & vectors.any(axis=1)
        return float(totals(groups, vectors, groups.rent)[ok].min()) if ok.any() else None
    order = np.argsort(-groups.memory / np.maximum(groups.rent, 1e-12), kind="stable")
    memory = np.cumsum(groups.memory[order])
    enough = np.flatnonzero(holds_states(problem, memory))
    return float(groups.rent[order][: enough[0] + 1].sum()) if enough.size else None


def rented_of(problem: Problem, plan) -> tuple[int, ...]:
    """The machines a plan rents (uses any device of)."""
    return rented_machines(problem, plan.devices)
