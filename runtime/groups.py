"""The one place that creates process groups.

torch.distributed requires every rank to call `new_group` for every group, in the same
order, even for groups it is not part of. `create_groups` walks the layout's groups in one
fixed order (TP groups in plan order, then DP chunk groups sorted by their rank sets) and
keeps the handles this rank belongs to in a `RankGroups` object that is passed explicitly
to the code that communicates — there is no module-level process state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from runtime.layout import RankLayout, StageRanks


@dataclass(frozen=True)
class RankGroups:
    """This rank's view of the process groups (handles are opaque torch objects)."""

    rank: int
    layout: RankLayout
    stage: StageRanks
    tp: object | None = None  # None when the stage has TP size 1
    dp: dict[tuple[int, ...], object] = field(default_factory=dict)  # rank set → group

    @property
    def tp_size(self) -> int:
        return self.stage.tp

    @property
    def tp_rank(self) -> int:
        return self.stage.ranks.index(self.rank)

    @property
    def is_leader(self) -> bool:
        return self.rank == self.stage.leader


def create_groups(layout: RankLayout, rank: int, timeout_s: float) -> RankGroups:
    """Create every group on every rank in one fixed order; return this rank's handles."""
    timeout = timedelta(seconds=timeout_s)
    stage = layout.stage_of(rank)
    mine: dict[tuple[str, tuple[int, ...]], dist.ProcessGroup] = {}
    ordered = [("tp", r) for r in layout.tp_group_keys()] + [("dp", r) for r in layout.dp_group_keys()]
    for kind, ranks in ordered:
        handle = dist.new_group(ranks=list(ranks), timeout=timeout)  # the only new_group call
        if rank in ranks:
            mine[(kind, ranks)] = handle
    tp_handle = next((h for (kind, _), h in mine.items() if kind == "tp"), None)
    dp_handles = {ranks: h for (kind, ranks), h in mine.items() if kind == "dp"}
    return RankGroups(rank=rank, layout=layout, stage=stage, tp=tp_handle, dp=dp_handles)
