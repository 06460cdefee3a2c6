"""Messages and collectives as chunks posted both ways at once (runtime/README.md, "Host
tensors travel in chunks"): how the communicator sends point-to-point messages and runs
all-gather, reduce-scatter and all-to-all on host tensors between machines, and the vendor
leaders' bridge exchange.

Why not gloo's own: between two namespaces joined by a 200 Mbit/s link, 2 ranks, 48 MiB to
send each way (`benchmarks/bench_duplex.py`, `benchmarks/report/duplex.md`), a message each
way took 1.97×, gloo's all-gather 1.53×, its reduce-scatter and all-to-all 2.0–2.1× what one
way alone takes, where the cost model prices each at one way (§3.4, §7.2); gloo's all-reduce
takes 1.02× its price, and stays. A single large gloo message each way does not carry both
directions of a link at once; chunks in flight together do: 1.00–1.04×.

A message at tag t sends chunk k at tag (t << CHUNK_TAG_BITS) | k (`post`). The collectives
take the group's backend handle (None: the default group) and global ranks, and wait for all
they posted; their chunks' tags start at `TAG_BASE`, above every message's, so that a
collective over the default group never takes a pipeline's message. Messages of one tag
between one pair arrive in the order they were posted, so back-to-back messages and
collectives cannot mix.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.communication.comm_types import Waiter

# Bytes per chunk (a message of more than 2^CHUNK_TAG_BITS of them takes larger ones). At
# 200 Mbit/s (`benchmarks/bench_duplex.py`), 12 MiB each way in 2 MiB chunks took 1.17–1.21×
# one way, in 128 KiB chunks 1.04–1.14× (48 MiB: 1.04×); 1 MiB each way in 2 MiB chunks, one
# message each way, took 1.9×, in 128 KiB chunks 1.1–1.5×.
CHUNK_BYTES = 128 << 10
CHUNK_TAG_BITS = 12  # a message's chunk k travels at tag (tag << CHUNK_TAG_BITS) | k
MESSAGE_TAGS = 1 << 18  # the runtime's own point-to-point tags stay below this (gloo takes 31-bit tags)
TAG_BASE = 1 << 30  # the collectives' tags: (TAG_BASE >> CHUNK_TAG_BITS) as a message tag, above any runtime tag


def chunks(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The pieces a contiguous `tensor` travels in: CHUNK_BYTES each (the last one less), or
    more where that would make over 2^CHUNK_TAG_BITS of them. Both ends cut alike: the cut
    depends on the element count and size alone."""
    nbytes = tensor.numel() * tensor.element_size()
    size = max(CHUNK_BYTES, -(-nbytes // (1 << CHUNK_TAG_BITS)))
    return tensor.view(-1).chunk(max(1, -(-nbytes // size)))


def chunk_tag(tag: int, index: int) -> int:
    return (tag << CHUNK_TAG_BITS) | index


def post(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], *, tag: int,
         handle: object | None = None) -> tuple[list[list], list[list]]:
    """Post every send (contiguous tensor, dst) and receive (contiguous buffer, src, filled in
    place) in chunks, without waiting: the works of each send and of each receive. Chunk k of
    every send and receive is posted before chunk k + 1 of any: posted as all sends, then all
    receives, both ways took what one way and then the other take (2.0× one way)."""
    cut = [(dist.isend, "dst", chunks(t), peer) for t, peer in sends] + \
          [(dist.irecv, "src", chunks(b), peer) for b, peer in recvs]
    works: list[list] = [[] for _ in cut]
    for index in range(max((len(pieces) for _, _, pieces, _ in cut), default=0)):
        for mine, (post_one, side, pieces, peer) in zip(works, cut):
            if index < len(pieces):
                mine.append(post_one(pieces[index], group=handle, tag=chunk_tag(tag, index), **{side: peer}))
    return works[:len(sends)], works[len(sends):]


def swap(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], *, handle: object | None,
         waiter: Waiter, what: str) -> None:
    """`post` at the collectives' tag, then wait for all it posted."""
    sent, received = post(sends, recvs, tag=TAG_BASE >> CHUNK_TAG_BITS, handle=handle)
    for work in [w for works in sent + received for w in works]:
        waiter.finish(work, what)


def all_gather(tensor: torch.Tensor, ranks: tuple[int, ...], rank: int, *, handle: object | None,
               waiter: Waiter) -> list[torch.Tensor]:
    """Every rank's `tensor`, in the order of `ranks`: each rank sends its own to every other."""
    mine = tensor.contiguous()
    out = [mine if r == rank else torch.empty_like(mine) for r in ranks]
    others = [(o, r) for o, r in zip(out, ranks) if r != rank]
    swap([(mine, r) for _, r in others], others, handle=handle, waiter=waiter,
         what=f"the all-gather on rank {rank}")
    return out


def reduce_scatter(tensor: torch.Tensor, ranks: tuple[int, ...], rank: int, *, handle: object | None,
                   waiter: Waiter) -> torch.Tensor:
    """The sum over `ranks` of this rank's block of `tensor` (dim 0 cut into len(ranks) equal
    blocks, in the order of `ranks`): block j goes to rank j, and each rank adds the blocks it
    gets in the order of `ranks`, so that every run sums in one order."""
    size = tensor.shape[0] // len(ranks)
    blocks = [b.contiguous() for b in tensor.detach().split(size)]
    index = ranks.index(rank)
    arrived = [blocks[index] if r == rank else torch.empty_like(blocks[index]) for r in ranks]
    swap([(b, r) for b, r in zip(blocks, ranks) if r != rank], [(a, r) for a, r in zip(arrived, ranks) if r != rank],
         handle=handle, waiter=waiter, what=f"the reduce-scatter on rank {rank}")
    out = arrived[0].clone()
    for block in arrived[1:]:
        out.add_(block)
    return out


def all_to_all(tensor: torch.Tensor, ranks: tuple[int, ...], rank: int, *, send_sizes: list[int],
               recv_sizes: list[int], handle: object | None, waiter: Waiter) -> torch.Tensor:
    """Uneven all-to-all of a 1-D `tensor`: the j-th rank of `ranks` gets the j-th run of
    `send_sizes[j]` elements; the result holds `recv_sizes[j]` elements from the j-th rank, in
    the order of `ranks`."""
    out = tensor.new_empty(sum(recv_sizes))
    sent, landed = tensor.detach().contiguous().split(send_sizes), out.split(recv_sizes)
    index = ranks.index(rank)
    landed[index].copy_(sent[index])
    swap([(s, r) for s, r in zip(sent, ranks) if r != rank and s.numel()],
         [(t, r) for t, r in zip(landed, ranks) if r != rank and t.numel()],
         handle=handle, waiter=waiter, what=f"the all-to-all on rank {rank}")
    return out
