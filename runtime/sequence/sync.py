"""Cross-replica gradient sync of a sequence plan, once per step (after the last micro-batch),
and the end-of-run check that every replica holds the same parameters.

Replicas shard every unit over different numbers of ranks, so each segment of a unit's
vector (`runtime.sequence.shards.sync_segments`) has one owner per replica; the segments of
one owner set are packed into one buffer and all-reduced over that set's group. Owner sets
are visited in one global order (`sync_group_keys`), so the blocking collectives cannot
deadlock.
"""

from __future__ import annotations

import torch

from runtime.communication.communicator import Communicator
from runtime.communication.packing import PackBuffers, hand_back
from runtime.sequence.groups import SeqGroups
from runtime.sequence.shards import Segment, sync_group_keys
from runtime.sequence.zero import ZeroStates


def _local_pieces(states: ZeroStates, segments: list[Segment], owners: tuple[int, ...]):
    """(unit, start, stop) in this rank's blocks of every segment owned by `owners`."""
    out = []
    for segment in segments:
        if segment.owners == owners:
            base = states.span(segment.unit)[0]
            out.append((segment.unit, segment.span[0] - base, segment.span[1] - base))
    return out


def _local_views(tensors: list[torch.Tensor], states: ZeroStates, segments: list[Segment],
                 owners: tuple[int, ...]) -> list[torch.Tensor]:
    """The views of `tensors` (one per unit: its block, or its gradient) that `owners` sync."""
    return [tensors[unit][start:stop] for unit, start, stop in _local_pieces(states, segments, owners)]


def sync_gradients(comm: Communicator, groups: SeqGroups, states: ZeroStates, segments: list[Segment],
                   buffers: PackBuffers) -> None:
    """Sum every gradient block over the replicas, packed into `buffers` (kept between steps;
    a block whose gradient went whole takes its part of the buffer as gradient)."""
    grads = [block.grad for block in states.blocks]
    for owners in sync_group_keys(segments):
        if owners not in groups.sync:
            continue
        pieces = [(states.blocks[unit], grads[unit][start:stop])
                  for unit, start, stop in _local_pieces(states, segments, owners)]
        summed = comm.all_reduce(buffers.pack(owners, [view for _, view in pieces]), groups.sync[owners])
        hand_back(summed, pieces)


def replicas_identical(comm: Communicator, groups: SeqGroups, states: ZeroStates, segments: list[Segment]) -> bool:
    """True on every rank iff every segment is bit-identical across its owners in all replicas."""
    blocks, same = [block.detach() for block in states.blocks], True
    for owners in sync_group_keys(segments):
        if owners not in groups.sync:
            continue
        mine = torch.cat(_local_views(blocks, states, segments, owners))
        highest = comm.all_reduce(mine.clone(), groups.sync[owners], "max")
        lowest = comm.all_reduce(mine.clone(), groups.sync[owners], "min")
        same = same and torch.equal(highest, mine) and torch.equal(lowest, mine)
    flag = torch.tensor([1 if same else 0], device=comm.device)
    return bool(comm.all_reduce(flag, comm.world, "min").item())
