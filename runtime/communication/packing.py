"""Flat buffers that many tensors are packed into for one collective, kept between steps.

A gradient sync packs a rank's gradients (or its shards' chunks) into one buffer per partner
set, so that it makes one collective per set. A buffer made afresh each step is new memory
each step: 100 MB of it cost 70 ms of page faults here, more than the copies in and out
(30 ms), where the cost model prices only the all-reduce. So each buffer is made once, at
the first step, and kept (as DDP keeps its buckets).

After the collective, a gradient that went into the buffer whole is not copied back: its
parameter takes its part of the buffer as `.grad` (`hand_back`), as DDP's
`gradient_as_bucket_view` does. Copying 100 MB back took 15 ms a step here (a DP-2 step of
the calibration bench is 460 ms). The optimizer reads the gradient there, and the next step
sets `.grad` to None before its backward, so the buffer is free again when it is packed.
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


def hand_back(flat: torch.Tensor, pieces: Sequence[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """The inverse of `PackBuffers.pack` for gradients: `pieces` are (parameter, view of its
    `.grad`), in the order packed. Where the view is the whole gradient, the parameter takes
    its part of `flat` as its gradient (no copy; `flat` must then stay untouched until the
    gradient is used and set to None); a part of a gradient is copied back into it, in place."""
    for (param, view), (_, part) in zip(pieces, _parts(flat, [view for _, view in pieces]), strict=True):
        if _is_whole(view, param.grad):
            param.grad = part
        else:
            view.copy_(part)


def _is_whole(view: torch.Tensor, tensor: torch.Tensor | None) -> bool:
    """Whether `view` covers every element of `tensor` (same start, shape and dense layout)."""
    return (tensor is not None and view.shape == tensor.shape and view.data_ptr() == tensor.data_ptr()
            and view.is_contiguous() and tensor.is_contiguous())


def _parts(flat: torch.Tensor, tensors: Sequence[torch.Tensor]):
    """Each tensor with its part of `flat` (one after another), shaped like it."""
    offset = 0
    for tensor in tensors:
        yield tensor, flat[offset:offset + tensor.numel()].view(tensor.shape)
        offset += tensor.numel()
