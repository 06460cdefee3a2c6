"""Sequence plan → rank layout: pure rank and token arithmetic, no torch (docs/sequence-plans.md §7.1).

Ranks are numbered in plan order (replica, group in ring order, member): replica 0's first
group gets ranks 0..n_0−1, and so on. For every rank the layout says which query heads and
kv heads it holds inside attention and which tokens of its group's shard it holds outside;
for every group, the true sequence positions of its shard (the mirrored layout: group g holds
[x_g, x_g+ℓ_g) then [s−x_g−ℓ_g, s−x_g), ℓ_g = T_g/2, x_g = Σ_{j<g} ℓ_j), so that golden tests
can check them without starting a process and the attention code only has to look them up.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from pydantic import Field, model_validator

from planner.base import Frozen
from planner.sequence.plan import SeqPlan

Span = tuple[int, int]  # [start, stop)


class LayoutError(ValueError):
    """A sequence plan that cannot be laid out on ranks (numbers included)."""


class SeqRank(Frozen):
    rank: int = Field(ge=0, description="global rank")
    device: int = Field(ge=0, description="plan device id")
    replica: int = Field(ge=0, description="replica index in the plan")
    group: int = Field(ge=0, description="ring position of the rank's group inside its replica")
    member: int = Field(ge=0, description="index of the rank inside its group")
    heads: Span = Field(description="query heads [start, stop) held inside attention")
    kv: Span = Field(description="kv heads [start, stop) held inside attention")
    tokens: Span = Field(description="rows [start, stop) of the group's shard held outside attention")

    @property
    def num_tokens(self) -> int:
        return self.tokens[1] - self.tokens[0]


class SeqGroup(Frozen):
    replica: int = Field(ge=0, description="replica index in the plan")
    group: int = Field(ge=0, description="ring position inside the replica")
    ranks: tuple[int, ...] = Field(min_length=1, description="global ranks of the members, in member order")
    spans: tuple[Span, Span] = Field(description="the two position ranges held, low end then high end")
    prev: int = Field(ge=0, description="ring position of the group this one receives K/V from")
    next: int = Field(ge=0, description="ring position of the group this one sends K/V to")

    @property
    def num_tokens(self) -> int:
        """T_g."""
        return sum(stop - start for start, stop in self.spans)

    def positions(self) -> np.ndarray:
        """The true sequence position of each row of the group's shard, in shard order."""
        return np.concatenate([np.arange(start, stop) for start, stop in self.spans])


class SeqReplica(Frozen):
    replica: int = Field(ge=0, description="replica index in the plan")
    batch: int = Field(ge=1, description="B_r, sequences per iteration")
    ranks: tuple[int, ...] = Field(min_length=1, description="global ranks, in rank order")
    groups: tuple[SeqGroup, ...] = Field(min_length=1, description="the ring, in ring order")


class SeqLayout(Frozen):
    seq_len: int = Field(ge=2, description="s, tokens of every sequence")
    heads: int = Field(ge=1, description="a, query heads of the model")
    kv_heads: int = Field(ge=1, description="k, kv heads of the model")
    ranks: tuple[SeqRank, ...] = Field(min_length=1, description="every rank, in rank order")
    replicas: tuple[SeqReplica, ...] = Field(min_length=1, description="every replica, in plan order")

    @model_validator(mode="after")
    def _ranks_in_order(self) -> SeqLayout:
        if [r.rank for r in self.ranks] != list(range(len(self.ranks))):
            raise ValueError("ranks must be listed as 0, 1, 2, ... in order")
        return self

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def rank(self, rank: int) -> SeqRank:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside the plan's world of {self.world_size} ranks")
        return self.ranks[rank]

    def group_of(self, rank: int) -> SeqGroup:
        record = self.rank(rank)
        return self.replicas[record.replica].groups[record.group]

    def ring_of(self, rank: int) -> tuple[SeqGroup, ...]:
        return self.replicas[self.rank(rank).replica].groups

    def positions_of(self, rank: int) -> np.ndarray:
        """The true sequence positions of the tokens `rank` holds outside attention."""
        start, stop = self.rank(rank).tokens
        return self.group_of(rank).positions()[start:stop]

    def ring_sends(self, rank: int) -> list[tuple[int, Span]]:
        """(rank, kv heads) of each member of the next group in the ring whose kv heads
        overlap this rank's, with the overlap: what this rank forwards at each ring step.
        Empty in a ring of one group."""
        return self._overlaps(rank, self.rank(rank).group + 1)

    def ring_recvs(self, rank: int) -> list[tuple[int, Span]]:
        """(rank, kv heads) of each member of the previous group whose kv heads overlap this
        rank's, in kv order: the pieces this rank assembles at each ring step."""
        return self._overlaps(rank, self.rank(rank).group - 1)

    def _overlaps(self, rank: int, other: int) -> list[tuple[int, Span]]:
        ring, (lo, hi) = self.ring_of(rank), self.rank(rank).kv
        if len(ring) == 1:
            return []
        peers = [self.rank(r) for r in ring[other % len(ring)].ranks]
        return [(p.rank, (max(lo, p.kv[0]), min(hi, p.kv[1]))) for p in peers if max(lo, p.kv[0]) < min(hi, p.kv[1])]

    @cached_property
    def hp_group_keys(self) -> list[tuple[int, ...]]:
        """Rank sets of the head-parallel groups with more than one member, in rank order."""
        return [g.ranks for r in self.replicas for g in r.groups if len(g.ranks) > 1]


def _check_plan(plan: SeqPlan, kv_heads: int) -> tuple[int, int]:
    """(s, a) of the plan; what the layout needs (the validator checks the rest against a problem)."""
    lengths = {r.tokens for r in plan.replicas}
    heads = {g.heads for r in plan.replicas for g in r.ring}
    if len(lengths) != 1:
        raise LayoutError(f"replicas cover different sequence lengths {sorted(lengths)}")
    if len(heads) != 1:
        raise LayoutError(f"groups hold different head totals {sorted(heads)}; each must hold all a heads")
    (seq_len,), (num_heads,) = lengths, heads
    if kv_heads < 1 or num_heads % kv_heads:
        raise LayoutError(f"{num_heads} query heads cannot share {kv_heads} kv heads evenly")
    for r, replica in enumerate(plan.replicas):
        for g, group in enumerate(replica.ring):
            if group.tokens % 2:
                raise LayoutError(f"replica {r} group {g}: T_g = {group.tokens} is odd; the mirrored layout halves it")
            for i, member in enumerate(group.members):
                if member.heads * kv_heads % num_heads:
                    raise LayoutError(f"replica {r} group {g} member {i}: {member.heads} heads is not a "
                                      f"multiple of a/k = {num_heads // kv_heads}")
    devices = plan.devices
    if len(set(devices)) != len(devices):
        raise LayoutError(f"devices {sorted({d for d in devices if devices.count(d) > 1})} are used twice")
    return seq_len, num_heads


def _group_spans(lengths: list[int], seq_len: int) -> list[tuple[Span, Span]]:
    """The mirrored layout: the low and high position ranges of each group in ring order."""
    spans, start = [], 0
    for length in lengths:
        half = length // 2
        spans.append(((start, start + half), (seq_len - start - half, seq_len - start)))
        start += half
    return spans


def _replica(plan: SeqPlan, r: int, first_rank: int, *, seq_len: int, num_heads: int,
             kv_heads: int) -> tuple[SeqReplica, list[SeqRank]]:
    """Replica r's groups and rank records, its ranks numbered from `first_rank`."""
    ring, groups, records, rank = plan.replicas[r].ring, [], [], first_rank
    spans = _group_spans([g.tokens for g in ring], seq_len)
    for g, group in enumerate(ring):
        head, token, ranks = 0, 0, []
        for i, member in enumerate(group.members):
            records.append(SeqRank(
                rank=rank, device=member.device, replica=r, group=g, member=i,
                heads=(head, head + member.heads),
                kv=(head * kv_heads // num_heads, (head + member.heads) * kv_heads // num_heads),
                tokens=(token, token + member.tokens)))
            ranks.append(rank)
            head, token, rank = head + member.heads, token + member.tokens, rank + 1
        groups.append(SeqGroup(replica=r, group=g, ranks=tuple(ranks), spans=spans[g],
                               prev=(g - 1) % len(ring), next=(g + 1) % len(ring)))
    replica = SeqReplica(replica=r, batch=plan.replicas[r].batch,
                         ranks=tuple(range(first_rank, rank)), groups=tuple(groups))
    return replica, records


def seq_rank_layout(plan: SeqPlan, *, kv_heads: int) -> SeqLayout:
    """Every rank's heads, kv heads and tokens, and every group's positions (pure; no processes)."""
    seq_len, num_heads = _check_plan(plan, kv_heads)
    replicas, ranks = [], []
    for r in range(len(plan.replicas)):
        replica, records = _replica(plan, r, len(ranks), seq_len=seq_len, num_heads=num_heads,
                                    kv_heads=kv_heads)
        replicas.append(replica)
        ranks += records
    return SeqLayout(seq_len=seq_len, heads=num_heads, kv_heads=kv_heads,
                     ranks=tuple(ranks), replicas=tuple(replicas))
