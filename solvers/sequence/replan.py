"""Re-planning a sequence plan after lost devices (docs/sequence-plans.md §7.1, docs/checkpoints.md §10): the old plan repaired
onto the survivors, that repair polished, and a fresh solve of the sequence solver.
`solvers.replan` takes the survivors' problem and id map, and keeps the better candidate.

The repair (device ids mapped to the survivors' first) keeps the old replicas, rings and
member order where they survived:
- a lost member's place goes to a survivor the plan left idle on the same machine, while
  there are any (the shares unchanged); else
- a group that lost some members deals their heads (whole kv heads) and tokens (token
  blocks) to its remaining members, one unit at a time to the member whose share per unit of
  speed grows least (§7.2 prices a member's linear work by t_i/π_i, its attention by
  heads_i/π_i): Σ heads = a still holds;
- a group that lost every member is dropped; its shard goes, 2q tokens at a time, to the
  other groups of its replica by the same rule over their speeds (every T_g stays a multiple
  of 2q, Σ_g T_g = s still holds), and inside each to its members;
- a replica that lost every group is dropped; its sequences go, one micro-batch at a time, to
  the other replicas by the same rule.
Memory (rule 5) may break: survivors hold bigger shards and ZeRO-3 splits the states over
fewer devices. So the repair is also polished (`solvers.sequence.polish`, whose first
criterion is the memory overflow; it splits the batches again by the rings' times).

No sequence solver reads a hint (`SolverOptions.hint` is a layered plan), so the repaired
plan is a candidate of its own beside the fresh solve.

A run resumed from a checkpoint keeps its model and sequence (`RunFit`): the runtime scales
a sequence plan to them (runtime/sequence/job.py), so each member's kv heads times the
trained model's kv heads must be a whole multiple of the problem's (the repair deals heads in
those units), and the run's sequence must hold every replica's groups — each shard even,
each member at least one token; token shares themselves need not scale exactly (the runtime
apportions them, and any split trains the same numbers). A fresh plan that misses is set
aside, and so is a polished repair.
"""

from __future__ import annotations

import time
from math import gcd

from pydantic import Field

from planner.base import Frozen
from planner.kinds import evaluate, validate
from planner.problem import Problem
from planner.sequence.plan import Replica, SeqPlan
from planner.workload import ModelSpec
from solvers.common import SolveResult, SolverOptions
from solvers.registry import solve
from solvers.repair_parts import Candidates, deal, keep_or_move
from solvers.sequence.coarse import device_speed
from solvers.sequence.polish import polish
from solvers.sequence.space import plan_of

MIN_FRESH_S = 0.05  # the fresh solve's least time, even when the repair spent the limit

Mapping = dict[int, int]
Ring = list[list[list[int]]]  # groups of [device, heads, tokens], being repaired


class RunFit(Frozen):
    """What a resumed run needs of a sequence plan (see the module text); nothing more than
    the problem's own rules when no run is being resumed."""
    head_unit: int = Field(ge=1, description="query heads per unit dealt (whole kv heads of the trained model)")
    token_unit: int = Field(ge=1, description="tokens per unit dealt: the token block q")
    trained_kv_heads: int | None = Field(default=None, ge=1, description="kv heads of the model being trained")
    trained_seq_len: int | None = Field(default=None, ge=1, description="the run's sequence length")

    @classmethod
    def of(cls, problem: Problem, trained: ModelSpec | None = None, seq_len: int | None = None) -> RunFit:
        model = problem.model
        per_kv, k = model.heads // model.num_kv_heads, model.num_kv_heads
        kv_step = k // gcd(k, trained.num_kv_heads) if trained else 1
        return cls(head_unit=per_kv * kv_step, token_unit=problem.training.token_block,
                   trained_kv_heads=trained.num_kv_heads if trained else None,
                   trained_seq_len=seq_len)

    def misfit(self, problem: Problem, plan: SeqPlan) -> str:
        """Why the run cannot train `plan` (the first reason), or "" when it can."""
        model, run_s = problem.model, self.trained_seq_len
        per_kv, k = model.heads // model.num_kv_heads, model.num_kv_heads
        for r, replica in enumerate(plan.replicas):
            least = sum(2 * -(-len(g.members) // 2) for g in replica.ring)  # even shards, ≥ 1 token a member
            if run_s and run_s < least:
                return f"replica {r}: its groups need at least {least} tokens of the run's {run_s}-token sequence"
            for g, group in enumerate(replica.ring):
                for i, m in enumerate(group.members):
                    if self.trained_kv_heads and (m.heads // per_kv * self.trained_kv_heads) % k:
                        return (f"replica {r} group {g} member {i}: {m.heads} heads are not whole kv heads of the "
                                f"trained model ({self.trained_kv_heads} kv heads for the problem's {k})")
        return ""


def _repair_group(members, mapping: Mapping, speed, fit: RunFit) -> list[list[int]] | None:
    """The group's surviving members (new ids) with the lost members' heads and tokens dealt
    to them; None when every member is lost."""
    alive = [[mapping[m.device], m.heads, m.tokens] for m in members if m.device in mapping]
    if not alive:
        return None
    speeds = [float(speed[m[0]]) for m in alive]
    heads = deal([m[1] for m in alive], speeds, sum(m.heads for m in members) - sum(m[1] for m in alive),
                 fit.head_unit)
    tokens = deal([m[2] for m in alive], speeds, sum(m.tokens for m in members) - sum(m[2] for m in alive),
                  fit.token_unit)
    return [[m[0], h, t] for m, h, t in zip(alive, heads, tokens)]


def _give_tokens(group: list[list[int]], extra: int, speed, fit: RunFit) -> None:
    """`extra` tokens of a dropped group dealt to this group's members (in place)."""
    tokens = deal([m[2] for m in group], [float(speed[m[0]]) for m in group], extra, fit.token_unit)
    for m, t in zip(group, tokens):
        m[2] = t


def _repair_ring(replica: Replica, r: int, mapping: Mapping, speed, fit: RunFit, changes: list[str]) -> Ring:
    """The replica's repaired ring (empty when every group is lost)."""
    ring, dropped = [], []
    for g, group in enumerate(replica.ring):
        fixed = _repair_group(group.members, mapping, speed, fit)
        lost = [m.device for m in group.members if m.device not in mapping]
        if fixed is None:
            dropped.append((g, group.tokens))
            continue
        ring.append(fixed)
        if lost:
            changes.append(f"replica {r} group {g}: lost device{'s' if len(lost) > 1 else ''} "
                           f"{', '.join(map(str, lost))}; heads {'/'.join(str(m[1]) for m in fixed)}, "
                           f"tokens {'/'.join(str(m[2]) for m in fixed)} (new ids {', '.join(str(m[0]) for m in fixed)})")
    if ring and dropped:
        shards = [sum(m[2] for m in g) for g in ring]
        grown = deal(shards, [sum(float(speed[m[0]]) for m in g) for g in ring], sum(t for _, t in dropped),
                     2 * fit.token_unit)
        for group, before, after in zip(ring, shards, grown):
            _give_tokens(group, after - before, speed, fit)
        changes += [f"replica {r} group {g} dropped (lost every member); its {t} tokens went to the ring's "
                    f"other groups (shards now {'/'.join(map(str, grown))})" for g, t in dropped]
    return ring


def stand_ins(old: Problem, plan: SeqPlan, new: Problem, mapping: Mapping, changes: list[str]) -> Mapping:
    """`mapping` with each lost member of the plan mapped to a survivor the plan left idle on
    the same machine (same GPU, same links), while there are any: it takes the member's place
    and shares as they were."""
    used = {mapping[d] for d in plan.devices if d in mapping}
    idle: dict[str, list[int]] = {}
    for d in range(new.cluster.num_devices):
        if d not in used:
            idle.setdefault(new.cluster.machines[int(new.cluster.machine_of_device[d])].name, []).append(d)
    placed = dict(mapping)
    for d in plan.devices:
        spare = idle.get(old.cluster.machines[int(old.cluster.machine_of_device[d])].name)
        if d not in mapping and spare:
            placed[d] = spare.pop(0)
            changes.append(f"lost device {d} replaced by idle device {placed[d]} (new id) of the same machine")
    return placed


def repair(old: Problem, plan: SeqPlan, new: Problem, mapping: Mapping,
           fit: RunFit | None = None) -> tuple[SeqPlan | None, list[str]]:
    """The old plan on the survivors (see the module text), and what the repair changed;
    None when every replica lost everything."""
    fit, speed, changes = fit or RunFit.of(old), device_speed(new), []
    mapping = stand_ins(old, plan, new, mapping, changes)
    repaired = [(_repair_ring(replica, r, mapping, speed, fit, changes) or None, replica.batch)
                for r, replica in enumerate(plan.replicas)]
    rings, batches, moved = keep_or_move(repaired, "replica", "lost every device", changes)
    if not rings:
        return None, changes
    replica_speed = [sum(float(speed[m[0]]) for g in ring for m in g) for ring in rings]
    batches = deal(batches, replica_speed, moved, old.training.micro_batch)
    return SeqPlan.from_rings(problem=new.name, batches=batches, rings=rings), changes


def priced(problem: Problem, plan: SeqPlan | None, fit: RunFit) -> float | None:
    """T of a valid plan that the run can train, else None."""
    if plan is None or validate(problem, plan) or fit.misfit(problem, plan):
        return None
    return evaluate(problem, plan).iteration_s


def best_repair(old: Problem, plan: SeqPlan, new: Problem, mapping: Mapping, fit: RunFit,
                deadline: float) -> tuple[SeqPlan | None, float | None, list[str]]:
    """The repaired plan or its polished version, whichever is valid, trainable and faster."""
    repaired, changes = repair(old, plan, new, mapping, fit)
    if repaired is None:
        return None, None, changes
    rings = [[[(m.device, m.heads, m.tokens) for m in g.members] for g in r.ring] for r in repaired.replicas]
    state = polish(new, rings, deadline)  # memory overflow first, then T; batches split again
    polished = plan_of(new, state.batches, state.rings)
    candidates = [(priced(new, p, fit), i, p) for i, p in enumerate((repaired, polished))]
    found = [c for c in candidates if c[0] is not None]
    if not found:
        reason = validate(new, repaired) or [fit.misfit(new, repaired)]
        return repaired, None, changes + [f"the repaired plan is not usable: {reason[0]}"]
    best_s, index, best = min(found, key=lambda c: (c[0], c[1]))
    return best, best_s, changes + (["polished: heads, tokens and batches moved"] if index else [])


def fresh_solve(new: Problem, solver: str, options: SolverOptions, fit: RunFit) -> tuple[SolveResult, list[str]]:
    """The sequence solver on the survivors; a plan the run cannot train is set aside (plan
    None, the reason as its message): the solvers have no knob for whole trained kv heads."""
    fresh = solve(new, solver, options.model_copy(update={"hint": None}), kind="sequence")
    why = fit.misfit(new, fresh.plan) if fresh.plan else ""
    if not why:
        return fresh, []
    return fresh.model_copy(update={"plan": None, "message": why}), [f"the fresh {solver} plan was set aside: {why}"]


def candidates(old: Problem, plan: SeqPlan, new: Problem, mapping: Mapping, *, solver: str,
               options: SolverOptions, trained: ModelSpec | None, trained_seq_len: int | None,
               deadline: float) -> Candidates:
    """The repaired plan (polished when that is faster) and the fresh sequence solve, each
    kept only when the run (`trained`, `trained_seq_len`: a resumed run's model and sequence)
    can train it."""
    fit = RunFit.of(old, trained, trained_seq_len)
    repaired, repaired_s, changes = best_repair(old, plan, new, mapping, fit, deadline)
    # the fresh solve gets what the repair and its polish left of the limit (with the whole
    # limit it had run past it by the repair's time: 3.5 s at -t 3 on a 32-GPU plan)
    left = max(MIN_FRESH_S, deadline - time.perf_counter())
    fresh, notes = fresh_solve(new, solver, options.model_copy(update={"time_limit_s": left}), fit)
    return Candidates(repaired, repaired_s, changes, fresh, notes)
