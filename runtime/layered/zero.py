"""ZeRO-1 across asymmetric pipelines: who holds which share of whose optimizer state
(docs/checkpoints.md §11; pure arithmetic, no torch, no process).

The gradient sync of §3.4 already cuts every unit into chunks of the finest TP shard, each
owned by D ranks, one per pipeline (`layout.chunk_groups`). A rank packs the chunks it
shares with one rank set into one flat vector, a *bucket*, in the layout's global order, so
that every owner of the set builds the same vector; with ZeRO-1 the i-th owner of the set
(ranks ascending, which is pipeline order) keeps the optimizer state of block i of that
vector: ⌈n/D⌉ elements, the last block shorter (`owned_span`). The same buckets drive the
runtime's reduce-scatter and all-gather (`runtime.layered.optimizer`) and the checkpoint's
chunk table (`runtime.layered.checkpoint`), so the two cannot disagree.

A piece of a bucket is one rectangle of a full tensor: a TP shard along its shard dimension,
cut again to the chunk (norm weights, replicated in a TP group, go whole with chunk 0). The
tied embeddings' copies (docs/cost-model.md §3.4) are summed over all their holders before
the DP sync, so their pieces form buckets of their own (`presummed`) that skip the
reduce-scatter.
"""

from __future__ import annotations

from typing import NamedTuple

from planner.workload import ModelSpec
from runtime.checkpoints.regions import flat_regions
from runtime.layered.layout import RankLayout
from runtime.model.catalogue import EMBEDDING, HEAD, unit_params


class Piece(NamedTuple):
    """A rectangle of the full tensor `name` that one rank puts into a bucket."""

    name: str
    dim: int | None  # the parameter's TP shard dimension (None: replicated)
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for size in self.sizes:
            count *= size
        return count


class Bucket(NamedTuple):
    """The pieces a rank shares with one rank set, in the order every owner packs them."""

    ranks: tuple[int, ...]  # one owner per pipeline, ascending
    presummed: bool  # the tied embeddings' copies: already summed over all their holders
    pieces: tuple[Piece, ...]

    @property
    def numel(self) -> int:
        return sum(piece.numel for piece in self.pieces)

    def owned_span(self, rank: int) -> tuple[int, int]:
        """The flat range [lo, hi) whose optimizer state `rank` keeps."""
        return owned_span(self.numel, len(self.ranks), self.ranks.index(rank))


def block_size(numel: int, owners: int) -> int:
    """⌈n/D⌉: every owner's padded block (the collectives move equal blocks)."""
    return -(-numel // owners)


def owned_span(numel: int, owners: int, index: int) -> tuple[int, int]:
    """Owner `index`'s real elements [lo, hi) of a bucket of `numel` elements."""
    block = block_size(numel, owners)
    return min(index * block, numel), min((index + 1) * block, numel)


def local_region(shape: tuple[int, ...], dim: int | None, tp_rank: int, tp: int) -> tuple[tuple, tuple]:
    """Global (offsets, sizes) of TP rank `tp_rank`'s contiguous block along `dim`."""
    offsets, sizes = [0] * len(shape), list(shape)
    if dim is not None and tp > 1:
        sizes[dim] = shape[dim] // tp
        offsets[dim] = tp_rank * sizes[dim]
    return tuple(offsets), tuple(sizes)


def _chunk_piece(shape, dim, tp_rank: int, tp: int, per_rank: int, local_chunk: int) -> tuple[tuple, tuple]:
    """The global rectangle of chunk `local_chunk` (of `per_rank`) of this TP rank's shard."""
    offsets, sizes = (list(x) for x in local_region(shape, dim, tp_rank, tp))
    size = sizes[dim] // per_rank
    offsets[dim] += local_chunk * size
    sizes[dim] = size
    return tuple(offsets), tuple(sizes)


def rank_buckets(layout: RankLayout, spec: ModelSpec, rank: int) -> list[Bucket]:
    """Every bucket `rank` shares with the other pipelines, in the one global order (by rank
    set, the tied copies' bucket after the others of the same set); none when D = 1."""
    stage = layout.stage_of(rank)
    tp_rank, found = stage.ranks.index(rank), {}
    for group in layout.chunk_groups:
        if rank not in group.ranks or len(group.ranks) == 1:
            continue
        per_rank = group.num_chunks // stage.tp  # chunks in each TP rank's shard
        local_chunk = group.chunk - tp_rank * per_rank
        for name, (shape, dim) in unit_params(spec, group.unit).items():
            tied = spec.tied_embeddings and name in (EMBEDDING, HEAD)
            if dim is None and group.chunk != 0:
                continue  # a replicated weight travels once, with chunk 0
            rect = local_region(shape, None, 0, 1) if dim is None else _chunk_piece(
                shape, dim, tp_rank, stage.tp, per_rank, local_chunk)
            found.setdefault((group.ranks, tied), []).append(Piece(name, dim, *rect))
    return [Bucket(ranks, tied, tuple(pieces)) for (ranks, tied), pieces in sorted(found.items())]


def zero_active(layout: RankLayout, zero_stage: int) -> bool:
    """ZeRO-1 shards only across pipelines: with one there is nobody to share with (§11)."""
    return zero_stage == 1 and layout.num_pipelines >= 2


class ShareRegion(NamedTuple):
    """A rectangle of a full tensor inside this rank's ZeRO-1 block: where it sits in the
    block (`at`), the global rectangle, and the bucket's index among the rank's buckets."""

    bucket: int
    name: str
    at: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


def share_regions(layout: RankLayout, spec: ModelSpec, rank: int) -> list[ShareRegion]:
    """Every rectangle of every tensor whose optimizer state `rank` keeps under ZeRO-1 (a range
    of a piece's row-major flattening is at most three rectangles: `flat_regions`)."""
    out = []
    for index, bucket in enumerate(rank_buckets(layout, spec, rank)):
        lo, hi = bucket.owned_span(rank)
        start = 0
        for piece in bucket.pieces:
            a, b = max(lo, start), min(hi, start + piece.numel)
            for rel_offsets, sizes, flat_lo, _ in flat_regions(piece.sizes, a - start, b - start) if a < b else ():
                offsets = tuple(o + r for o, r in zip(piece.offsets, rel_offsets))
                out.append(ShareRegion(index, piece.name, start + flat_lo - lo, offsets, sizes))
            start += piece.numel
    return out
