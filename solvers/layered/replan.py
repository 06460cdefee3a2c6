"""Re-planning a layered plan after lost devices (docs/checkpoints.md §10): the old plan repaired onto
the survivors, its micro-batches rebalanced, and a fresh solve warm-started from it.
`solvers.replan` takes the survivors' problem and id map, and keeps the better candidate.

The repair keeps the old plan's structure where it survived: a stage that lost devices
takes idle survivors of the same machine in their place, else shrinks its TP group to the
largest power of two of what is left; a pipeline with a stage left empty is dropped and its
sequences go to the other pipelines, in micro-batches; then the micro-batches are re-split
over the pipelines by their priced times (`rebalance`). The fresh solve is any registered
layered solver, given the repaired plan as its hint (CP-SAT and MILP warm-start from it; the
heuristic ignores hints, which is why the repaired plan is also a candidate of its own).
"""

from __future__ import annotations

import heapq

from planner.kinds import evaluate
from planner.layered.plan import Plan
from planner.problem import Problem
from planner.workload import ModelSpec
from solvers.common import SolveResult, SolverOptions
from solvers.layered.heuristic.options import HeuristicOptions
from solvers.layered.heuristic.search import solve_with
from solvers.registry import solve
from solvers.repair_parts import Candidates, deal, keep_or_move, valid_time


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
    takes T_p(m) ≈ fill-and-drain + (m − 1)·its steady step (docs/cost-model.md §3), so micro-batches go,
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
    repaired_s = valid_time(problem, plan)
    if repaired_s is None:
        return plan, None
    balanced = rebalance(problem, plan)
    balanced_s = valid_time(problem, balanced)
    return (balanced, balanced_s) if balanced_s is not None and balanced_s < repaired_s else (plan, repaired_s)


def misfit_tp(plan: Plan, trained: ModelSpec | None) -> str:
    """Why `plan` cannot run the model actually trained (a TP size that does not split its
    heads, kv heads, ffn or vocabulary — a run resumed from a checkpoint keeps its model),
    or "" when it can (or no model is given)."""
    for t in sorted({s.tp for p in plan.pipelines for s in p.stages}) if trained else []:
        if trained.tp_misfits(t):
            return f"TP {t} does not divide the trained model's {trained.tp_misfits(t)[0]}"
    return ""


def _fresh_within_tp(problem: Problem, options: SolverOptions, trained: ModelSpec):
    """The heuristic with every stage's TP held to the largest power of two that splits the
    trained model (its `max_tp` limit, kept by its moves too; the exact solvers have no such limit)."""
    cap = 1
    while not trained.tp_misfits(cap * 2) and cap * 2 <= problem.cluster.num_devices:
        cap *= 2
    return solve_with(problem, options, HeuristicOptions(max_tp=cap), name=f"heuristic (TP ≤ {cap})")


def _layered_fresh(new: Problem, solver: str, options: SolverOptions, hint: Plan | None,
                   trained: ModelSpec | None) -> tuple[SolveResult, list[str]]:
    """The fresh solve of a layered plan, warm-started from the repaired one; a plan whose TP
    sizes cannot split the trained model is set aside for the TP-capped heuristic."""
    options = options.model_copy(update={"hint": hint})
    fresh, notes = solve(new, solver, options, kind="layered"), []
    if fresh.plan is not None and misfit_tp(fresh.plan, trained):
        notes.append(f"the fresh {solver} plan was set aside: {misfit_tp(fresh.plan, trained)}")
        fresh = _fresh_within_tp(new, options, trained)
    return fresh, notes


def candidates(old: Problem, plan: Plan, new: Problem, mapping: dict[int, int], *, solver: str,
               options: SolverOptions, trained: ModelSpec | None, trained_seq_len: int | None,
               deadline: float) -> Candidates:
    """The repaired plan (rebalanced when that is faster) and the fresh solve warm-started from
    it. `trained_seq_len` and `deadline` are not used: a layered plan runs any sequence, and
    the repair takes no search."""
    repaired, changes = repair(old, plan, new, mapping)
    repaired, repaired_s = _best_repair(new, repaired)
    fresh, notes = _layered_fresh(new, solver, options, repaired if repaired_s else None, trained)
    return Candidates(repaired, repaired_s, changes, fresh, notes)
