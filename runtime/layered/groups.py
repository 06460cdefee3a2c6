"""Which process groups a layered plan needs, created in one order on every rank.

torch.distributed requires every rank to create every group, in the same order, even groups
it is not part of. `create_groups` walks the layout's groups in one fixed order (TP groups in
plan order, then DP chunk groups sorted by their rank sets), has the communicator create each
(`Communicator.new_group`, the runtime's only group creation), and keeps the groups this rank
belongs to in a `RankGroups` object that is passed explicitly to the code that communicates —
there is no module-level process state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.communication.communicator import Communicator, Group
from runtime.layered.layout import RankLayout, StageRanks


@dataclass(frozen=True)
class RankGroups:
    """This rank's view of the process groups."""

    rank: int
    layout: RankLayout
    stage: StageRanks
    tp: Group | None = None  # None when the stage has TP size 1
    dp: dict[tuple[int, ...], Group] = field(default_factory=dict)  # rank set → group
    tied: dict[tuple[int, ...], Group] = field(default_factory=dict)  # tied embeddings' rank sets

    @property
    def tp_size(self) -> int:
        return self.stage.tp

    @property
    def tp_rank(self) -> int:
        return self.stage.ranks.index(self.rank)

    @property
    def is_leader(self) -> bool:
        return self.rank == self.stage.leader


def create_groups(layout: RankLayout, comm: Communicator, tied: bool = False) -> RankGroups:
    """Create every group on every rank in one fixed order; return this rank's groups.
    `tied`: also the tied embeddings' groups (a rank set that is a DP group's too reuses it)."""
    rank, tp, dp, tied_groups = comm.rank, None, {}, {}
    for ranks in layout.tp_group_keys():
        group = comm.new_group(ranks)
        if rank in ranks:
            tp = group
    for ranks in layout.dp_group_keys():
        group = comm.new_group(ranks)
        if rank in ranks:
            dp[ranks] = group
    for ranks in layout.tied_group_keys() if tied else ():
        group = dp.get(ranks) if ranks in layout.dp_group_keys() else comm.new_group(ranks)
        if rank in ranks:
            tied_groups[ranks] = group
    return RankGroups(rank=rank, layout=layout, stage=layout.stage_of(rank), tp=tp, dp=dp, tied=tied_groups)
