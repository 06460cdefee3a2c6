"""Plans from the configuration bound's tables (docs/bounds.md §8): the integer test's
solution at the least threshold it could not refute, read back into real plans.

For the D whose least non-refuted threshold v is lowest, HiGHS's solution of [U2] names D
usage vectors; each is read back through the usage table's DP (the breakpoint that gives it
the most micro-batches, then the argmin of every DP step) as a relaxed pipeline: class-level
stages (class, t) with layer counts, first stage first and last stage last. Concrete devices
of each class are assigned machine by machine (a pipeline's stages stay on the machine of
the previous stage while it has room), the batch is split by pipeline speed, memory is
repaired, and the plan is polished like the heuristic's (layers and micro-batches); the best
then gets the heuristic's structure moves. The evaluator prices every candidate; a plan is
only kept when it validates. Nothing here is
part of the bound: these plans only raise the incumbent from above.
"""

from __future__ import annotations

import time

import numpy as np

from planner.layered.plan import Plan
from planner.layered.pricing import iteration_time
from planner.layered.table import stage_table
from planner.layered.validate import validate
from planner.prices import within_budget
from planner.problem import Problem
from solvers.layered.bound import integer
from solvers.layered.bound.classes import ClassTypes
from solvers.layered.bound.pricing import SLACK, layer_limits, stage_contribution
from solvers.layered.bound.search import ConfigurationBound
from solvers.layered.bound.usage import UsageTable, prefix_table
from solvers.layered.heuristic.assemble import make_plan, plan_from_table, repair_memory, split_batches, with_split
from solvers.layered.heuristic.moves import assemble, improve
from solvers.layered.heuristic.options import HeuristicOptions
from solvers.layered.heuristic.pipeline import StageSlot
from solvers.layered.heuristic.polish import polish

Stage = tuple[int, int, str]  # (class-level type index, layers, role)
MAX_D_TRIED = 3  # the D with the lowest non-refuted thresholds, each read back into plans


def plans_from_bound(problem: Problem, bound: ConfigurationBound, deadline: float) -> list[Plan]:
    """Valid plans read back from the tables of the D with the lowest non-refuted thresholds
    (best first by the evaluator's T); [] without the usage route."""
    if not bound.usage or not bound.types:
        return []
    ranked = sorted((e.feasible_at, d) for d, e in bound.per_d.items() if e.feasible_at is not None)
    found = []
    for v, d in ranked[:MAX_D_TRIED]:
        if time.perf_counter() > deadline:
            break
        for types, table in [(bound.types[d], bound.usage[d])] + (bound.fewest.built(d) if bound.fewest else []):
            pipes = read_back(types, table, v, bound.rent)  # the route's pipelines, and [U16]'s of few stages
            if pipes:
                found += priced_plans(problem, types, pipes, deadline)
    plans = [p for _, _, p in sorted(found, key=lambda x: (x[0], x[1]))]
    if plans and problem.cluster.num_devices <= HeuristicOptions().move_devices:
        moved = improve(problem, plans[0], polish=lambda p: polished(problem, p, deadline), deadline=deadline)
        plans.insert(0, moved)  # improve only returns a plan of lower T (or its start)
    return plans


def read_back(types: ClassTypes, table: UsageTable, threshold: float,
              rent: integer.Rent | None = None) -> list[list[Stage]]:
    """The relaxed pipelines of the integer test's solution at `threshold` ([] if none)."""
    usages = integer.chosen_usages(table, types.pipelines, types.micro_batches, threshold, rent)
    pipes = []
    for u in usages:
        k = _best_breakpoint(table, u, threshold)
        stages = trace(types, float(table.b[k]), u) if k is not None else None
        if stages is None:
            return []
        pipes.append(stages)
    return pipes


def _best_breakpoint(table: UsageTable, usage: tuple[int, ...], threshold: float) -> int | None:
    """The breakpoint whose relaxed pipeline of this usage runs the most micro-batches within
    the threshold (the least bubble among ties)."""
    least = table.least.reshape((len(table.b),) + table.dims)[(slice(None),) + usage].astype(np.float64)
    with np.errstate(invalid="ignore"):
        runs = np.where(least <= threshold, np.floor((threshold - least) / table.b * (1 + SLACK)) + 1, -1)
    if runs.max() < 1:
        return None
    ties = np.flatnonzero(runs == runs.max())
    return int(ties[np.argmin(least[ties])])


def trace(types: ClassTypes, b: float, usage: tuple[int, ...]) -> list[Stage] | None:
    """The DP's argmin behind least[b, usage] ([U1]): first stage, middle stages, last stage."""
    bs = np.array([b])
    prefix = prefix_table(types, bs)[0]  # [L+1, *dims]
    big_l = types.layers
    options = [(float(stage_contribution(types, "single")[i, big_l]), None, (i, big_l, "single"))
               for i in range(types.num_types) if _alone(types, i, usage)
               and big_l <= layer_limits(types, bs, "single")[0, i]]
    options += _steps(types, prefix, layer_limits(types, bs, "last")[0], "last", big_l, usage)
    if not options or not np.isfinite(min(o[0] for o in options)):
        return None
    _, state, stage = min(options, key=lambda o: o[0])
    stages = [stage]
    first_limit, middle_limit = layer_limits(types, bs, "first")[0], layer_limits(types, bs, "middle")[0]
    while state is not None:
        ell, u = state
        here = [(float(stage_contribution(types, "first")[i, ell]), None, (i, ell, "first"))
                for i in range(types.num_types) if _alone(types, i, u) and ell <= first_limit[i]]
        here += _steps(types, prefix, middle_limit, "middle", ell, u)
        value, state, stage = min(here, key=lambda o: o[0])
        if not np.isfinite(value):
            return None
        stages.append(stage)
    return stages[::-1]


def _alone(types: ClassTypes, i: int, usage: tuple[int, ...]) -> bool:
    """Whether a single stage of type i uses exactly `usage`."""
    want = np.zeros(len(usage), dtype=int)
    want[types.cls[i]] = types.tp[i]
    return tuple(want.tolist()) == tuple(usage)


def _steps(types: ClassTypes, prefix: np.ndarray, limit: np.ndarray, role: str, ell: int, usage: tuple[int, ...]):
    """(value, previous state, stage) for every stage of `role` added last to a prefix state."""
    contrib = stage_contribution(types, role)
    out = []
    for i in range(types.num_types):
        k, t = int(types.cls[i]), int(types.tp[i])
        if usage[k] < t:
            continue
        before = tuple(u - (t if j == k else 0) for j, u in enumerate(usage))
        for n in range(1, min(ell - 1, int(limit[i])) + 1):
            value = float(prefix[(ell - n,) + before] + np.float32(contrib[i, n]))
            out.append((value, (ell - n, before), (i, n, role)))
    return out


def assign_devices(problem: Problem, types: ClassTypes, pipes: list[list[Stage]],
                   aligned: bool) -> list[list[StageSlot]] | None:
    """Concrete TP groups for every stage, or None when the machines' sizes do not let every
    group fit. `aligned`: stages in order of their first layer (all pipelines' stages of the
    same layers side by side), each on the first machine of its class with room — the holders
    of a layer share a machine and sync at its intra bandwidth. Else pipeline by pipeline
    (most devices first), each stage on the previous stage's machine while it has room, else
    on the machine of its class with the most free devices — a pipeline's hops stay inside
    machines."""
    cluster = problem.cluster
    free = {m: list(cluster.devices_of(m)) for m in range(len(cluster.machines))}
    stages = [arranged(types, p) for p in pipes]
    starts = [np.cumsum([0] + [n for _, n, _ in st])[:-1] for st in stages]
    order = sorted(((p, k) for p in range(len(pipes)) for k in range(len(stages[p]))),
                   key=(lambda x: (starts[x[0]][x[1]], x[0])) if aligned else
                   (lambda x: (-sum(int(types.tp[i]) for i, _, _ in stages[x[0]]), x[0], x[1])))
    slots: dict[tuple[int, int], StageSlot] = {}
    for p, k in order:
        kind, t = int(types.cls[stages[p][k][0]]), int(types.tp[stages[p][k][0]])
        room = [m for m in free if int(types.class_of_machine[m]) == kind and len(free[m]) >= t]
        if not room:
            return None
        previous = slots[(p, k - 1)].machine if k and not aligned else None
        m = room[0] if aligned else previous if previous in room else max(room, key=lambda m: (len(free[m]), -m))
        slots[(p, k)] = StageSlot(machine=m, devices=tuple(free[m][:t]))
        free[m] = free[m][t:]
    return [[slots[(p, k)] for k in range(len(stages[p]))] for p in range(len(pipes))]


def arranged(types: ClassTypes, stages: list[Stage]) -> list[Stage]:
    """First stage, middle stages grouped by class (the first's class leading, the last's
    trailing, larger TP groups first within a class), last stage."""
    if len(stages) <= 2:
        return stages
    head, tail = int(types.cls[stages[0][0]]), int(types.cls[stages[-1][0]])
    key = lambda s: (int(types.cls[s[0]]) != head, int(types.cls[s[0]]) == tail, int(types.cls[s[0]]), -int(types.tp[s[0]]))  # noqa: E731
    return [stages[0], *sorted(stages[1:-1], key=key), stages[-1]]


def priced_plans(problem: Problem, types: ClassTypes, pipes: list[list[Stage]], deadline: float):
    """(T, rank, plan) of the valid plans built from these relaxed pipelines: the DP's own
    layer split and phase 2's water-filling, each with batches by speed and polished."""
    layers = [np.array([n for _, n, _ in arranged(types, stages)]) for stages in pipes]
    drafts = []
    for aligned in (True, False):
        slots = assign_devices(problem, types, pipes, aligned)
        if slots is not None:
            drafts += [_with_batches(problem, slots, layers), assemble(problem, tuple(tuple(s) for s in slots))]
    out = []
    for rank, draft in enumerate(d for d in drafts if d is not None):
        if time.perf_counter() > deadline:
            break
        plan = polished(problem, draft, deadline)
        if not validate(problem, plan) and within_budget(problem, plan):
            out.append((iteration_time(problem, plan), rank, plan))
    return out


def _with_batches(problem: Problem, slots: list[list[StageSlot]], layers: list[np.ndarray]) -> Plan | None:
    """The plan of these slots with the DP's layer counts, micro-batches by pipeline speed and
    the memory repair (the table's caps are at one micro-batch in flight)."""
    draft = make_plan(problem, slots, layers, [1] * len(slots))
    table = stage_table(problem, draft)
    micro = split_batches(problem, table, equal=False)
    if micro is None:
        return None
    table = with_split(table, table.layers, micro, problem.training.micro_batch)
    fixed = repair_memory(problem, table)
    if fixed is None:
        return None
    return plan_from_table(problem, draft, with_split(table, fixed, micro, problem.training.micro_batch))


def polished(problem: Problem, plan: Plan, deadline: float) -> Plan:
    """The heuristic's polish (single layer and micro-batch moves while T drops)."""
    table = stage_table(problem, plan)
    layers, micro, _ = polish(problem, table, deadline=deadline)
    return plan_from_table(problem, plan, with_split(table, layers, micro, problem.training.micro_batch))
