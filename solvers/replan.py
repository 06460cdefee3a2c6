"""Re-planning after lost devices (DESIGN.md §10): the survivors' problem, the old plan
repaired onto it (the warm start), a fresh solve, and the better of the two.

Device ids are positions in the cluster (machine 0's devices first), so removing devices
shifts every later id: `survivors` returns the smaller problem (named `<name>-minus<k>`, so
a plan in its ids is not taken for one of the old problem) and the map old id → new id, and
every plan returned here is written in the new problem's ids.

The repair keeps the old plan's structure where it survived: a stage that lost devices
takes idle survivors of the same machine in their place, else shrinks its TP group to the
largest power of two of what is left; a pipeline with a stage left empty is dropped and its
sequences go to the other pipelines, in micro-batches; then the micro-batches are re-split
over the pipelines by their priced times (`rebalance`). The fresh solve is any registered
solver (`solvers.registry.solve`), given the repaired plan as its hint (CP-SAT and MILP
warm-start from it; the heuristic ignores hints, which is why the repaired plan is also a
candidate of its own). The faster valid plan wins.

That is the layered repair; a sequence plan (`planner.kinds.kind_of`) is repaired, polished
and solved afresh by `solvers.sequence.replan`, and the rest — survivors, id map, the
choice, what changed — is shared.
"""

from __future__ import annotations

import heapq
import time

from pydantic import Field

from planner.base import Frozen, format_seconds
from planner.hardware import Cluster
from planner.kinds import evaluate, kind_of, validate
from planner.layered.plan import Plan
from planner.problem import Problem
from planner.sequence.plan import SeqPlan
from planner.workload import ModelSpec
from solvers.common import SolveResult, SolverOptions
from solvers.layered.heuristic.options import HeuristicOptions
from solvers.layered.heuristic.search import solve_with
from solvers.registry import solve
from solvers.repair_parts import deal, keep_or_move
from solvers.sequence import replan as sequence_replan


class ReplanError(ValueError):
    """The lost devices cannot be removed (unknown ids, nothing left); one line."""


class ReplanResult(Frozen):
    problem: Problem = Field(description="the survivors' problem (new device ids)")
    plan: Plan | SeqPlan = Field(description="the new plan (the old plan's kind), in the new problem's ids")
    lost: tuple[int, ...] = Field(description="the lost devices, old ids")
    old_to_new: dict[int, int] = Field(description="old device id → new id, for every survivor")
    old_s: float | None = Field(description="the old plan's T on the old problem")
    new_s: float = Field(description="the new plan's T")
    chosen: str = Field(description="repaired (the old plan's structure) or the fresh solver's name")
    repaired_s: float | None = Field(default=None, description="T of the repaired old plan (None: invalid)")
    fresh_s: float | None = Field(default=None, description="T of the fresh solve (None: no plan)")
    changes: tuple[str, ...] = Field(default=(), description="what changed, one line each")
    wall_s: float = Field(ge=0, description="re-planning wall time")


def lost_devices(problem: Problem, devices=(), machines=()) -> set[int]:
    """Device ids and whole machines (by name or index) → the set of lost device ids."""
    cluster, lost = problem.cluster, set()
    for d in devices:
        if not 0 <= int(d) < cluster.num_devices:
            raise ReplanError(f"device {d} is not in the cluster (ids 0..{cluster.num_devices - 1})")
        lost.add(int(d))
    index = cluster.machine_index
    for m in machines:
        key = int(m) if str(m).isdigit() else index.get(str(m))
        if key is None or not 0 <= key < len(cluster.machines):
            raise ReplanError(f"machine {m!r} is not in the cluster (machines: {', '.join(index)})")
        lost.update(cluster.devices_of(key))
    if len(lost) >= cluster.num_devices:
        raise ReplanError("every device of the cluster is lost: nothing to re-plan on")
    return lost


def survivors(problem: Problem, lost: set[int]) -> tuple[Problem, dict[int, int]]:
    """The problem on the surviving devices and the map old id → new id."""
    cluster, machines, mapping = problem.cluster, [], {}
    for m, machine in enumerate(cluster.machines):
        keep = [d for d in cluster.devices_of(m) if d not in lost]
        for d in keep:
            mapping[d] = len(mapping)
        if keep:
            machines.append(machine.model_dump() | {"count": len(keep)})
    names = {m["name"] for m in machines}
    data = cluster.model_dump()
    data["machines"] = machines
    data["links"] = [link for link in data["links"] if link["a"] in names and link["b"] in names]
    data["racks"] = [rack | {"machines": [n for n in rack["machines"] if n in names]} for rack in data["racks"]
                     if sum(n in names for n in rack["machines"]) >= 2]
    new = problem.model_copy(update={"cluster": Cluster.model_validate(data),
                                     "name": f"{problem.name}-minus{len(lost)}"})
    return Problem.model_validate(new.model_dump()), mapping


def _idle_by_machine(problem: Problem, plan: Plan, mapping: dict[int, int]) -> dict[str, list[int]]:
    """Surviving devices the old plan left idle, by machine name (new ids)."""
    used = {mapping[d] for d in plan.devices if d in mapping}
    cluster, idle = problem.cluster, {}
    for d in range(cluster.num_devices):
        if d not in used:
            idle.setdefault(cluster.machines[int(cluster.machine_of_device[d])].name, []).append(d)
    return idle


def _repair_stage(devices, mapping, pool: list[int], where: str, changes: list[str]) -> list[int]:
    """A stage's survivors (new ids), topped up from `pool` (idle devices of its machine)."""
    alive = [mapping[d] for d in devices if d in mapping]
    if len(alive) == len(devices):
        return alive
    while len(alive) < len(devices) and pool:
        alive.append(pool.pop(0))
    if len(alive) == len(devices):
        changes.append(f"{where}: lost devices replaced by idle ones of the same machine")
        return alive
    kept = alive[:1 << (len(alive).bit_length() - 1)] if alive else []
    if kept:
        changes.append(f"{where}: TP {len(devices)} → {len(kept)} (devices {', '.join(map(str, kept))}, new ids)")
    return kept


def repair(old: Problem, plan: Plan, new: Problem, mapping: dict[int, int]) -> tuple[Plan | None, list[str]]:
    """The old plan on the survivors (see the module text), and what the repair changed."""
    idle, cluster = _idle_by_machine(new, plan, mapping), old.cluster
    home = lambda stage: cluster.machines[int(cluster.machine_of_device[stage.devices[0]])].name  # noqa: E731
    changes, repaired = [], []
    for p, pipe in enumerate(plan.pipelines):
        stages = [(_repair_stage(s.devices, mapping, idle.setdefault(home(s), []), f"pipeline {p} stage {k}",
                                 changes), s.layers) for k, s in enumerate(pipe.stages)]
        repaired.append((stages if all(devices for devices, _ in stages) else None, pipe.batch))
    kept, batches, dropped = keep_or_move(repaired, "pipeline", "a stage lost every device", changes)
    if not kept:
        return None, changes
    # the dropped sequences go one micro-batch at a time in proportion to the batches, which
    # the old plan balanced against each pipeline's speed
    batches = deal(batches, [float(b) for b in batches], dropped, old.training.micro_batch)
    return Plan.from_stages(problem=new.name, batches=batches, stages=kept), changes


def rebalance(problem: Problem, plan: Plan) -> Plan:
    """The same pipelines with the micro-batches re-split to even out their times: pipeline p
    takes T_p(m) ≈ fill-and-drain + (m − 1)·its steady step (DESIGN.md §3), so micro-batches go,
    one at a time, where they finish soonest. A repaired plan's shrunk stages slow their
    pipelines; this hands their work to the others."""
    estimate, b = evaluate(problem, plan), problem.training.micro_batch
    pipes = estimate.pipelines
    step = [p.steady_s / (p.micro_batches - 1) if p.micro_batches > 1 else p.bubble_s / len(p.stages)
            for p in pipes]
    counts = [1] * len(pipes)
    heap = [(pipes[i].bubble_s + step[i], i) for i in range(len(pipes))]
    heapq.heapify(heap)
    for _ in range(sum(p.micro_batches for p in pipes) - len(pipes)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, (pipes[i].bubble_s + counts[i] * step[i], i))
    return plan.model_copy(update={"pipelines": tuple(
        p.model_copy(update={"batch": m * b}) for p, m in zip(plan.pipelines, counts))})


def _best_repair(problem: Problem, plan: Plan | None) -> tuple[Plan | None, float | None]:
    """The repaired plan, or its rebalanced version when that is valid and faster."""
    repaired_s = _priced(problem, plan)
    if repaired_s is None:
        return plan, None
    balanced = rebalance(problem, plan)
    balanced_s = _priced(problem, balanced)
    return (balanced, balanced_s) if balanced_s is not None and balanced_s < repaired_s else (plan, repaired_s)


def _priced(problem: Problem, plan: Plan | None) -> float | None:
    if plan is None or validate(problem, plan):
        return None
    return evaluate(problem, plan).iteration_s


def misfit_tp(plan: Plan, trained: ModelSpec | None) -> str:
    """Why `plan` cannot run the model actually trained (a TP size that does not split its
    heads, kv heads, ffn or vocabulary — a run resumed from a checkpoint keeps its model),
    or "" when it can (or no model is given)."""
    for t in sorted({s.tp for p in plan.pipelines for s in p.stages}) if trained else []:
        if trained.tp_misfits(t):
            return f"TP {t} does not divide the trained model's {trained.tp_misfits(t)[0]}"
    return ""


def _fresh_within_tp(problem: Problem, options: SolverOptions, trained: ModelSpec):
    """The heuristic with every stage's TP capped at the largest power of two that splits the
    trained model (its `tp_caps` knob; the exact solvers have no such cap)."""
    cap = 1
    while not trained.tp_misfits(cap * 2) and cap * 2 <= problem.cluster.num_devices:
        cap *= 2
    return solve_with(problem, options, HeuristicOptions(tp_caps=(cap,)), name=f"heuristic (TP ≤ {cap})")


def _layered_fresh(new: Problem, solver: str, options: SolverOptions, hint: Plan | None,
                   trained: ModelSpec | None) -> tuple[SolveResult, list[str]]:
    """The fresh solve of a layered plan, warm-started from the repaired one; a plan whose TP
    sizes cannot split the trained model is set aside for the TP-capped heuristic."""
    options = options.model_copy(update={"hint": hint})
    fresh, notes = solve(new, solver, options), []
    if fresh.plan is not None and misfit_tp(fresh.plan, trained):
        notes.append(f"the fresh {solver} plan was set aside: {misfit_tp(fresh.plan, trained)}")
        fresh = _fresh_within_tp(new, options, trained)
    return fresh, notes


def _candidates(problem: Problem, plan: Plan | SeqPlan, new: Problem, mapping: dict[int, int], *, solver: str,
                options: SolverOptions, trained: ModelSpec | None, trained_seq_len: int | None, start: float):
    """(repaired plan, its T or None, what the repair changed, the fresh solve, notes), by the
    plan's kind: each kind repairs its own structure."""
    if kind_of(plan).name == "sequence":
        fit = sequence_replan.RunFit.of(problem, trained, trained_seq_len)
        repaired, repaired_s, changes = sequence_replan.best_repair(
            problem, plan, new, mapping, fit, start + options.time_limit_s)
        return (repaired, repaired_s, changes, *sequence_replan.fresh_solve(new, solver, options, fit))
    repaired, changes = repair(problem, plan, new, mapping)
    repaired, repaired_s = _best_repair(new, repaired)
    return (repaired, repaired_s, changes,
            *_layered_fresh(new, solver, options, repaired if repaired_s else None, trained))


def replan(problem: Problem, plan: Plan | SeqPlan, lost=(), *, lost_machines=(), solver: str = "heuristic",
           options: SolverOptions | None = None, trained: ModelSpec | None = None,
           trained_seq_len: int | None = None) -> ReplanResult:
    """Remove the lost devices (ids of `problem`) or machines, re-solve with the repaired old
    plan as the warm start (layered) or beside it (sequence), and keep the better of it and the
    fresh solve. With `trained` (an elastic run's model) and, for sequence plans,
    `trained_seq_len` (its sequence), a plan that cannot run that model is not chosen: a
    layered plan's TP sizes must split it; a sequence plan's shares must scale to it
    (`solvers.sequence.replan.RunFit`). The layered repair only shrinks TP by powers of two,
    so it splits whatever the old plan did."""
    start = time.perf_counter()
    gone = lost_devices(problem, lost, lost_machines)
    new, mapping = survivors(problem, gone)
    repaired, repaired_s, changes, fresh, notes = _candidates(
        problem, plan, new, mapping, solver=solver, options=options or SolverOptions(), trained=trained,
        trained_seq_len=trained_seq_len, start=start)
    fresh_s = _priced(new, fresh.plan)
    if repaired_s is None and fresh_s is None:
        raise ReplanError(f"no valid plan on the {new.cluster.num_devices} surviving devices "
                          f"({'; '.join(notes) or fresh.message or fresh.status.value})")
    use_repaired = fresh_s is None or (repaired_s is not None and repaired_s <= fresh_s)
    chosen_plan, new_s = (repaired, repaired_s) if use_repaired else (fresh.plan, fresh_s)
    old_s = _priced(problem, plan)
    return ReplanResult(problem=new, plan=chosen_plan, lost=tuple(sorted(gone)), old_to_new=mapping,
                        old_s=old_s, new_s=new_s, chosen="repaired" if use_repaired else fresh.solver,
                        repaired_s=repaired_s, fresh_s=fresh_s, wall_s=time.perf_counter() - start,
                        changes=tuple(summary(plan, chosen_plan, (changes if use_repaired else []) + notes, old_s, new_s)))


def shape(plan: Plan | SeqPlan) -> str:
    """The plan's structure in one phrase."""
    if isinstance(plan, SeqPlan):
        return sequence_replan.shape(plan)
    return (f"D={len(plan.pipelines)}, {plan.num_stages} stages, {len(plan.devices)} devices, "
            f"TP {'/'.join(str(s.tp) for p in plan.pipelines for s in p.stages)}")


def summary(old: Plan | SeqPlan, new: Plan | SeqPlan, repairs: list[str], old_s: float | None,
            new_s: float) -> list[str]:
    """What changed, one line each: the shape of the plan, the repairs, and T."""

    lines = [f"plan: {shape(old)} → {shape(new)}", *repairs]
    if old_s is not None:
        lines.append(f"T: {format_seconds(old_s)} → {format_seconds(new_s)} ({(new_s / old_s - 1) * 100:+.1f}%)")
    else:
        lines.append(f"T: {format_seconds(new_s)} (the old plan was not valid for its problem)")
    return lines
