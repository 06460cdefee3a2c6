"""Flat buffers that many tensors are packed into for one collective, kept between steps.

A gradient sync packs a rank's gradients (or its shards' chunks) into one buffer per partner
set, so that it makes one collective per set. A buffer made afresh each step is new memory
each step: 100 MB of it cost 70 ms of page faults here, more than the copies in and out
(30 ms), where the cost model prices only the all-reduce. So each buffer is made once, at
the first step, and kept (as DDP keeps its buckets).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


class PackBuffers:
    """One kept flat buffer per key; owned by the code that syncs (one per rank and run)."""

    def __init__(self) -> None:
        self._kept: dict[Hashable, torch.Tensor] = {}

    def pack(self, key: Hashable, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """`tensors` copied one after another into the key's buffer (made, or remade when
        their size, dtype or device changed); returns the buffer."""
        first, count = tensors[0], sum(t.numel() for t in tensors)
        flat = self._kept.get(key)
        if flat is None or flat.numel() != count or flat.dtype != first.dtype or flat.device != first.device:
            flat = self._kept[key] = torch.empty(count, dtype=first.dtype, device=first.device)
        for tensor, part in _parts(flat, tensors):
            part.copy_(tensor)
        return flat


def unpack(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """The inverse of `PackBuffers.pack`: each tensor takes its part of `flat` back, in place."""
    for tensor, part in _parts(flat, tensors):
        tensor.copy_(part)


def _parts(flat: torch.Tensor, tensors: Sequence[torch.Tensor]):
    """Each tensor with its part of `flat` (one after another), shaped like it."""
    offset = 0
    for tensor in tensors:
        yield tensor, flat[offset:offset + tensor.numel()].view(tensor.shape)
        offset += tensor.numel()
