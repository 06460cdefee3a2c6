"""Re-planning a sequence plan after lost devices (docs/sequence-plans.md §7.1, docs/checkpoints.md §10): the old plan repaired
onto the survivors, that repair polished, and a fresh solve of the sequence solver.
`solvers.replan` takes the survivors' problem and id map, and keeps the better candidate.

The repair (device ids mapped to the survivors' first) keeps the old replicas, rings and
member order where they survived, and never returns a plan over memory (rule 5: every deal
below gives a unit only where the whole ring still fits, by the validator's own §7.3 terms,
`planner.sequence.pricing.memory_parts`):
- a lost member's place goes to a survivor the plan left idle on the same machine, while
  there are any (the shares unchanged); else
- a group that lost some members deals their heads (whole kv heads) and tokens (token
  blocks) to its remaining members, one unit at a time to the member whose share per unit of
  speed grows least (§7.2 prices a member's linear work by t_i/π_i, its attention by
  heads_i/π_i) among those with room — water-filling: a member whose memory is full is
  passed over and the rest goes to the others —: Σ heads = a still holds;
- a group that lost every member is dropped; its shard goes, 2q tokens at a time, to the
  other groups of its replica by the same rule over their speeds (every T_g stays a multiple
  of 2q, Σ_g T_g = s still holds), and inside each to its members;
- when the survivors' memory cannot hold the lost shares on top of their own (ZeRO-3 splits
  the states over fewer devices, so they may be over before anything is dealt), the
  replica's whole sequence is dealt again by the same rule, from one token block a member;
- a replica that lost every group, or whose survivors hold its sequence neither way, is
  dropped (those survivors left idle); its sequences go, one micro-batch at a time, to the
  other replicas by the same rule (memory does not depend on B_r). When that leaves no
  replica, `NoRoom` says why, and that is the re-plan's reason (`ReplanResult.repaired_why`).
The repair is then polished (`solvers.sequence.polish`: T, batches split again by the rings'
times). When no repair fits, the plain deal (memory not looked at) is polished instead, whose
first criterion is the memory overflow: offered only if that brings it under memory.

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
from collections.abc import Callable
from dataclasses import dataclass
from math import gcd

import numpy as np
from pydantic import Field

from planner.base import Frozen
from planner.kinds import evaluate, validate
from planner.problem import Problem
from planner.sequence.plan import Replica, SeqPlan
from planner.workload import ModelSpec
from solvers.common import SolveResult, SolverOptions
from solvers.registry import solve
from solvers.repair_parts import Candidates, Moves, deal, deal_capped, keep_or_move
from solvers.sequence.shard_memory import ShardDeal, fit_shards, proportional, rings_fit
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


class NoRoom(ValueError):
    """No memory-feasible repair: some lost heads or tokens fit in no survivor's memory (one line)."""


@dataclass
class Dealer:
    """Deals a replica's lost heads and tokens on the survivors' problem by speed; `capped`: only
    where memory holds them (else memory is not looked at: the plain deal, for `polish`)."""

    problem: Problem
    speed: np.ndarray  # per device (new ids)
    fit: RunFit
    capped: bool = True

    def fits(self, ring: Ring) -> bool:
        """Whether every member of a replica's ring fits in its device's memory: the validator's
        own §7.3 terms (`memory_parts`, rule 5), for one micro-batch (memory does not depend on B_r)."""
        return not self.capped or bool(rings_fit(self.problem, [ring])[0])

    def speeds(self, group: list[list[int]]) -> list[float]:
        return [float(self.speed[m[0]]) for m in group]

    def taker(self, ring: Ring, g: int, field: int) -> Callable[[Moves], bool]:
        """`take` of `deal_capped`: more heads (field 1) or tokens (field 2) to members of group
        g, kept only when the whole ring still fits (a member's memory grows with its group's
        shard and the ring's largest one, not only with its own share)."""
        def take(moves: Moves) -> bool:
            for i, size in moves:
                ring[g][i][field] += size
            if self.fits(ring):
                return True
            for i, size in moves:
                ring[g][i][field] -= size
            return False
        return take

    def fill_group(self, ring: Ring, g: int, lost: tuple[int, int], where: str) -> None:
        """The lost members' heads, then tokens (`lost`), dealt to group g's survivors (in place);
        NoRoom when some find no member with room."""
        for field, total, unit, what in ((1, lost[0], self.fit.head_unit, "heads"),
                                         (2, lost[1], self.fit.token_unit, "tokens")):
            loads = [m[field] for m in ring[g]]
            if deal_capped(loads, self.speeds(ring[g]), total, unit, self.taker(ring, g, field)) is None:
                raise NoRoom(f"{where}: the lost members' {total} {what} fit in no surviving member's memory")

    def group_takes(self, ring: Ring, moves: Moves) -> bool:
        """`take` of shards (2q tokens each) by groups, each dealt to its members by speed in
        token blocks (in place); undone, and False, when they do not all fit. A run of shards is
        dealt plainly and checked once: if it fits, the members took what they would have taken
        one block at a time under memory; one shard is dealt under memory (`group_takes_one`)."""
        if len(moves) == 1:
            return self.group_takes_one(ring, *moves[0])
        before = [[m[2] for m in group] for group in ring]
        for g, size in moves:
            dealt = deal([m[2] for m in ring[g]], self.speeds(ring[g]), size, self.fit.token_unit)
            for m, tokens in zip(ring[g], dealt):
                m[2] = tokens
        if self.fits(ring):
            return True
        for group, tokens in zip(ring, before):
            for m, t in zip(group, tokens):
                m[2] = t
        return False

    def group_takes_one(self, ring: Ring, g: int, size: int) -> bool:
        """Group g takes `size` tokens, dealt to its members under memory (in place); undone,
        and False, when they do not all fit."""
        before = [m[2] for m in ring[g]]
        if deal_capped(before, self.speeds(ring[g]), size, self.fit.token_unit, self.taker(ring, g, 2)) is not None:
            return True
        for m, tokens in zip(ring[g], before):
            m[2] = tokens
        return False

    def deal_shards(self, ring: Ring, total: int) -> list[int] | None:
        """`total` tokens dealt to the ring's groups 2q at a time by group speed (every T_g stays
        a multiple of 2q; Σ_g T_g = s still holds), each inside to its members (in place); the
        new shards, None when some find no group with room."""
        shards = [sum(m[2] for m in group) for group in ring]
        return deal_capped(shards, [sum(self.speeds(group)) for group in ring], total, 2 * self.fit.token_unit,
                           lambda moves: self.group_takes(ring, moves))


def _survivors(replica: Replica, mapping: Mapping) -> tuple[Ring, list[int], list[tuple[int, int]]]:
    """The replica's groups that kept a member — the survivors at their old shares, new ids —,
    their positions in the old ring, and (position, shard) of each group that lost every member."""
    ring, kept, dropped = [], [], []
    for g, group in enumerate(replica.ring):
        alive = [[mapping[m.device], m.heads, m.tokens] for m in group.members if m.device in mapping]
        if alive:
            ring.append(alive)
            kept.append(g)
        else:
            dropped.append((g, group.tokens))
    return ring, kept, dropped


def _lost_shares(group, kept: list[list[int]]) -> tuple[int, int]:
    """(heads, tokens) the group's lost members held: what its survivors must take."""
    return group.heads - sum(m[1] for m in kept), group.tokens - sum(m[2] for m in kept)


def _keep_shares(dealer: Dealer, replica: Replica, r: int, mapping: Mapping) -> tuple[Ring, list[str]]:
    """The replica's survivors keeping their shares, the lost members' heads and tokens dealt to
    their groups and the dropped groups' shards to the other groups."""
    ring, kept, dropped = _survivors(replica, mapping)
    changes = []
    for i, g in enumerate(kept):
        lost = [m.device for m in replica.ring[g].members if m.device not in mapping]
        if not lost:
            continue
        dealer.fill_group(ring, i, _lost_shares(replica.ring[g], ring[i]), f"group {g}")
        changes.append(f"replica {r} group {g}: lost device{'s' if len(lost) > 1 else ''} "
                       f"{', '.join(map(str, lost))}; heads {'/'.join(str(m[1]) for m in ring[i])}, "
                       f"tokens {'/'.join(str(m[2]) for m in ring[i])} (new ids {', '.join(str(m[0]) for m in ring[i])})")
    if ring and dropped:
        grown = dealer.deal_shards(ring, sum(t for _, t in dropped))
        if grown is None:
            raise NoRoom(f"the dropped groups' {sum(t for _, t in dropped)} tokens fit in no other group's memory")
        changes += [f"replica {r} group {g} dropped (lost every member); its {t} tokens went to the ring's "
                    f"other groups (shards now {'/'.join(map(str, grown))})" for g, t in dropped]
    return ring, changes


def _least_tokens(ring: Ring, speed, q: int) -> None:
    """Every member down to one token block, and one more to the fastest member of a group of
    odd size (T_g a multiple of 2q): where a re-deal starts (in place)."""
    for group in ring:
        tokens = deal([q] * len(group), [float(speed[m[0]]) for m in group], q * (len(group) % 2), q)
        for m, t in zip(group, tokens):
            m[2] = t


def _redeal(dealer: Dealer, replica: Replica, r: int, mapping: Mapping) -> tuple[Ring, list[str]]:
    """The replica's survivors with the whole sequence dealt again: tokens from one block each
    (`_least_tokens`), a lost member's heads to its group's survivors, then the rest of the
    sequence 2q at a time by group speed."""
    ring, kept, _ = _survivors(replica, mapping)
    _least_tokens(ring, dealer.speed, dealer.fit.token_unit)
    for i, g in enumerate(kept):
        dealer.fill_group(ring, i, (_lost_shares(replica.ring[g], ring[i])[0], 0), f"group {g}")
    rest = dealer.problem.training.seq_len - sum(m[2] for group in ring for m in group)
    if rest < 0:
        raise NoRoom(f"its {sum(map(len, ring))} survivors need more token blocks than the sequence has")
    shards = _fitted_shards(dealer, ring) or dealer.deal_shards(ring, rest)
    if shards is None:
        raise NoRoom(f"its survivors' memory cannot hold the {dealer.problem.training.seq_len}-token sequence, "
                     f"even dealt again from one token block each")
    return ring, [f"replica {r}: its survivors' memory could not also hold the lost shares; the whole "
                  f"sequence dealt again by speed under memory (shards {'/'.join(map(str, shards))}, "
                  f"heads {' | '.join('/'.join(str(m[1]) for m in g) for g in ring)})"]


def _fitted_shards(dealer: Dealer, ring: Ring) -> list[int] | None:
    """The whole sequence over the ring's groups (members' tokens from one block each) by the
    heuristic's memory fit (`shard_memory.fit_shards`: shards by speed, capped by each group's
    room, dealt again), in place; None when it finds no fit. The greedy deal (`deal_shards`) fills
    the fastest groups first, and where a growing group enlarges the ring buffers of a full one
    it took the others for full too: it said "cannot hold" where this fits (QA: 24 of 98 cases)."""
    q, n_units = dealer.fit.token_unit, dealer.problem.training.seq_len // (2 * dealer.fit.token_unit)
    least = [-(-len(group) // 2) for group in ring]
    weights = [sum(dealer.speeds(group)) for group in ring]
    units = proportional(weights, n_units, least)

    def split(parts: list[int]) -> list:
        return [[[m[0], m[1], t] for m, t in zip(group, deal([q] * len(group), dealer.speeds(group),
                                                              2 * q * u - q * len(group), q))]
                for group, u in zip(ring, parts)]

    fitted = fit_shards(dealer.problem, [ShardDeal(weights, least, units, split)])[0] if units else None
    if fitted is None:
        return None
    ring[:] = fitted
    return [2 * q * u for u in _units_of(fitted, q)]


def _units_of(ring: Ring, q: int) -> list[int]:
    return [sum(m[2] for m in group) // (2 * q) for group in ring]


def _repair_ring(dealer: Dealer, replica: Replica, r: int, mapping: Mapping, changes: list[str]) -> Ring:
    """The replica's repaired ring (empty when every group is lost): the survivors keep their
    shares while their memory holds the lost ones too, else the sequence is dealt again; NoRoom
    when neither fits."""
    try:
        ring, said = _keep_shares(dealer, replica, r, mapping)
    except NoRoom:
        ring, said = _redeal(dealer, replica, r, mapping)
    if ring and not dealer.fits(ring):  # nothing was dealt, and the ring was over memory as it was
        raise NoRoom("its survivors are over memory with nothing dealt to them")
    changes += said
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


def _ring_or_why(dealer: Dealer, replica: Replica, r: int, mapping: Mapping,
                 changes: list[str]) -> tuple[Ring, NoRoom | None]:
    """The replica's repaired ring (empty when every group is lost), or none and why its
    survivors' memory cannot hold its sequence (they are left idle)."""
    try:
        return _repair_ring(dealer, replica, r, mapping, changes), None
    except NoRoom as error:
        return [], error


def repair(old: Problem, plan: SeqPlan, new: Problem, mapping: Mapping, fit: RunFit | None = None,
           capped: bool = True) -> tuple[SeqPlan | None, list[str]]:
    """The old plan on the survivors (see the module text), and what the repair changed;
    None when every replica lost everything. `capped`: no plan over memory is returned — a
    replica whose survivors' memory cannot hold its sequence is dropped, and NoRoom says why
    when that leaves none —; else memory is not looked at."""
    fit, speed, changes = fit or RunFit.of(old), device_speed(new), []
    dealer = Dealer(new, speed, fit, capped)
    mapping = stand_ins(old, plan, new, mapping, changes)
    tried = [_ring_or_why(dealer, replica, r, mapping, changes) for r, replica in enumerate(plan.replicas)]
    whys = [f"no memory-feasible repair: {error}" if error else "lost every device" for _, error in tried]
    rings, batches, moved = keep_or_move([(ring or None, replica.batch) for (ring, _), replica
                                          in zip(tried, plan.replicas)], "replica", whys, changes)
    if not rings:
        no_room = [f"replica {r}: {error}" for r, (_, error) in enumerate(tried) if error]
        if no_room:
            raise NoRoom("; ".join(no_room))
        return None, changes
    replica_speed = [sum(float(speed[m[0]]) for g in ring for m in g) for ring in rings]
    batches = deal(batches, replica_speed, moved, old.training.micro_batch)
    return SeqPlan.from_rings(problem=new.name, batches=batches, rings=rings), changes


def priced(problem: Problem, plan: SeqPlan | None, fit: RunFit) -> float | None:
    """T of a valid plan that the run can train, else None."""
    if plan is None or validate(problem, plan) or fit.misfit(problem, plan):
        return None
    return evaluate(problem, plan).iteration_s


def _repaired(old: Problem, plan: SeqPlan, new: Problem, mapping: Mapping,
              fit: RunFit) -> tuple[SeqPlan | None, list[str], str]:
    """The repair under memory, what changed and ''; when there is none, the plain repair (over
    memory: only a polish that brings it under may be offered), its changes and why."""
    try:
        return *repair(old, plan, new, mapping, fit), ""
    except NoRoom as error:
        return *repair(old, plan, new, mapping, fit, capped=False), str(error)


def best_repair(old: Problem, plan: SeqPlan, new: Problem, mapping: Mapping, fit: RunFit,
                deadline: float) -> tuple[SeqPlan | None, float | None, list[str], str]:
    """The repaired plan or its polished version, whichever is valid, trainable and faster, and
    what changed; (None, None, changes, why) when neither is ('' for why when nothing survived)."""
    repaired, changes, no_room = _repaired(old, plan, new, mapping, fit)
    if repaired is None:
        return None, None, changes, f"no memory-feasible repair ({no_room})" if no_room else ""
    rings = repaired.rings()
    state = polish(new, rings, deadline)  # memory overflow first, then T; batches split again
    polished = plan_of(new, state.batches, state.rings)
    candidates = [(priced(new, p, fit), i, p) for i, p in enumerate((repaired, polished))]
    found = [c for c in candidates if c[0] is not None]
    if not found:
        why = (f"no memory-feasible repair: {no_room}" if no_room
               else str((validate(new, repaired) or [fit.misfit(new, repaired)])[0]))
        return None, None, changes, why
    best_s, index, best = min(found, key=lambda c: (c[0], c[1]))
    said = ([f"no deal of the repair fits in memory ({no_room}); the plain deal, polished, fits"] if no_room
            else ["polished: heads, tokens and batches moved"] if index else [])
    return best, best_s, changes + said, ""


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
    repaired, repaired_s, changes, why = best_repair(old, plan, new, mapping, fit, deadline)
    # the fresh solve gets what the repair and its polish left of the limit (with the whole
    # limit it had run past it by the repair's time: 3.5 s at -t 3 on a 32-GPU plan)
    left = max(MIN_FRESH_S, deadline - time.perf_counter())
    fresh, notes = fresh_solve(new, solver, options.model_copy(update={"time_limit_s": left}), fit)
    return Candidates(repaired, repaired_s, changes, fresh, notes, why)
