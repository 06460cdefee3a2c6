"""runtime.packing: the gradient sync's kept flat buffers."""

from __future__ import annotations

import torch

from runtime.packing import PackBuffers, unpack


def test_pack_then_unpack_round_trips_strided_views_in_place():
    """Views of the kind the syncs pack (a column block, a row block, a 1-D slice) come back
    into the very tensors they view, after the buffer was changed as a collective would."""
    grad, other, vector = torch.arange(24.0).view(4, 6), torch.arange(10.0).view(5, 2), torch.arange(7.0)
    views = [grad.narrow(1, 2, 3), other.narrow(0, 1, 2), vector[2:6]]
    flat = PackBuffers().pack("k", views)
    expected = torch.cat([v.reshape(-1) for v in views])
    assert torch.equal(flat, expected)
    flat.mul_(10)
    unpack(flat, views)
    assert torch.equal(grad[:, 2:5], torch.arange(24.0).view(4, 6)[:, 2:5] * 10)
    assert torch.equal(grad[:, :2], torch.arange(24.0).view(4, 6)[:, :2])  # outside the view: untouched
    assert torch.equal(other[1:3], torch.arange(10.0).view(5, 2)[1:3] * 10) and torch.equal(vector[6:], torch.tensor([6.0]))


def test_a_buffer_is_made_once_per_key_and_remade_only_when_its_size_or_dtype_changes():
    buffers, a, b = PackBuffers(), torch.ones(3, 4), torch.ones(5)
    first = buffers.pack(("dp", 0, 1), [a, b])
    again = buffers.pack(("dp", 0, 1), [a * 2, b * 2])
    assert again.data_ptr() == first.data_ptr() and torch.equal(again, torch.full((17,), 2.0))
    assert buffers.pack("other", [a]).data_ptr() != first.data_ptr()
    assert buffers.pack(("dp", 0, 1), [a]).numel() == 12  # fewer elements: a buffer of the new size
    assert buffers.pack(("dp", 0, 1), [a.double()]).dtype == torch.float64
