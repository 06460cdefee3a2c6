"""Which process groups a sequence plan needs, created in one order on every rank: the one
place this kind creates groups.

torch.distributed requires every rank to create every group, in the same order, even groups
it is not part of. `create_groups` walks them in one fixed order — the head-parallel group
of every group with several members (plan order), the ZeRO-3 group of every replica with
several ranks (plan order), then the cross-replica sync groups (owner sets of the shard
segments, sorted) — has the communicator create each, and keeps this rank's in a
`SeqGroups` passed explicitly to the code that communicates (no module-level state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.communication.communicator import Communicator, Group
from runtime.sequence.layout import SeqLayout
from runtime.sequence.shards import Segment, sync_group_keys


@dataclass(frozen=True)
class SeqGroups:
    """This rank's view of the process groups."""

    rank: int
    layout: SeqLayout
    hp: Group | None = None  # None: the rank's group has one member
    replica: Group | None = None  # None: the replica has one rank (no ZeRO-3 traffic)
    sync: dict[tuple[int, ...], Group] = field(default_factory=dict)  # owner set → group

    @property
    def replica_ranks(self) -> tuple[int, ...]:
        return self.layout.replicas[self.layout.rank(self.rank).replica].ranks

    @property
    def replica_index(self) -> int:
        """This rank's position in its replica: which ZeRO-3 block of every unit it holds."""
        return self.replica_ranks.index(self.rank)


def replica_group_keys(layout: SeqLayout) -> list[tuple[int, ...]]:
    return [r.ranks for r in layout.replicas if len(r.ranks) > 1]


def create_groups(layout: SeqLayout, comm: Communicator, segments: list[Segment]) -> SeqGroups:
    """Create every group on every rank in one fixed order; return this rank's groups.
    `segments`: the cross-replica sync segments (empty with one replica)."""
    rank, hp, replica, sync = comm.rank, None, None, {}
    for ranks in layout.hp_group_keys:
        group = comm.new_group(ranks)
        hp = group if rank in ranks else hp
    for ranks in replica_group_keys(layout):
        group = comm.new_group(ranks)
        replica = group if rank in ranks else replica
    for ranks in sync_group_keys(segments):
        group = comm.new_group(ranks)
        if rank in ranks:
            sync[ranks] = group
    return SeqGroups(rank=rank, layout=layout, hp=hp, replica=replica, sync=sync)
