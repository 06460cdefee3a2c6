"""ZeRO-3 shard arithmetic of a sequence plan (pure: numbers only, no process or collective).

Model states are kept per *unit* — the embedding (unit 0), each layer (1..L), the final norm
with the LM head (L+1), as in `runtime.model.llama.unit_params` — each unit as one flat vector of
its parameters in catalogue order. Inside replica r (N_r ranks), rank j holds the block
[j·c, (j+1)·c) of every unit's vector, c = ⌈P_u/N_r⌉ (the last blocks are padded with
zeros, so the all-gather and the reduce-scatter move equal blocks).

Replicas cut the same vector differently (N_r differs), so the cross-replica gradient sync
works on *segments*: the pieces between every replica's block boundaries; each segment is
owned by exactly one rank per replica, and the segments of one owner set are all-reduced
together over that set's group (`sync_segments`, `sync_group_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from planner.workload import ModelSpec
from runtime.model.llama import stored_name, unit_params

Span = tuple[int, int]


@dataclass(frozen=True)
class UnitCatalogue:
    """One unit's parameters inside its flat vector: name → (full shape, [start, stop))."""

    unit: int
    params: dict[str, tuple[tuple[int, ...], Span]]

    @property
    def size(self) -> int:
        return max(stop for _, (_, stop) in self.params.values())


def unit_catalogues(spec: ModelSpec) -> list[UnitCatalogue]:
    """Every unit's flat layout, units 0..L+1; a tied head is not in unit L+1 (the member
    model uses the embedding's unit for it)."""
    out = []
    for unit in range(spec.layers + 2):
        offset, params = 0, {}
        for name, (shape, _) in unit_params(spec, unit).items():
            if stored_name(spec, name) != name:
                continue
            params[name] = (shape, (offset, offset + prod(shape)))
            offset += prod(shape)
        out.append(UnitCatalogue(unit=unit, params=params))
    return out


def block_size(size: int, parts: int) -> int:
    """c = ⌈size/parts⌉: the padded block every rank of a replica of `parts` ranks holds."""
    return -(-size // parts)


def block_span(size: int, parts: int, index: int) -> Span:
    """The real (unpadded) elements [start, stop) of block `index` of a unit of `size`."""
    c = block_size(size, parts)
    return min(index * c, size), min((index + 1) * c, size)


@dataclass(frozen=True)
class Segment:
    """Elements [start, stop) of a unit's vector and their owner in every replica."""

    unit: int
    span: Span
    owners: tuple[int, ...]  # one global rank per replica, in replica order


def sync_segments(sizes: list[int], replica_ranks: list[tuple[int, ...]]) -> list[Segment]:
    """The cross-replica segments of every unit (`sizes[u]` elements), in unit then offset order."""
    out = []
    for unit, size in enumerate(sizes):
        cuts = sorted({size} | {block_span(size, len(ranks), j)[0] for ranks in replica_ranks
                                for j in range(len(ranks))})
        for start, stop in zip(cuts, cuts[1:]):
            if start < stop:
                owners = tuple(ranks[start // block_size(size, len(ranks))] for ranks in replica_ranks)
                out.append(Segment(unit=unit, span=(start, stop), owners=owners))
    return out


def sync_group_keys(segments: list[Segment]) -> list[tuple[int, ...]]:
    """The owner sets of the segments, each once, in one global (sorted) order."""
    return sorted({s.owners for s in segments})
