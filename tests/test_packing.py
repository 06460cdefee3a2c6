"""runtime.communication.packing: the gradient sync's kept flat buffers."""

from __future__ import annotations

import torch

from runtime.communication.packing import PackBuffers, hand_back


def _with_grads(*grads: torch.Tensor) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads):
        param.grad = grad
    return params


def test_pack_then_hand_back_round_trips_strided_views_in_place():
    """Parts of gradients of the kind the syncs pack (a column block, a row block, a 1-D
    slice) come back into the very tensors they view, after the buffer was changed as a
    collective would."""
    params = _with_grads(torch.arange(24.0).view(4, 6), torch.arange(10.0).view(5, 2), torch.arange(7.0))
    grad, other, vector = (p.grad for p in params)
    views = [grad.narrow(1, 2, 3), other.narrow(0, 1, 2), vector[2:6]]
    flat = PackBuffers().pack("k", views)
    expected = torch.cat([v.reshape(-1) for v in views])
    assert torch.equal(flat, expected)
    flat.mul_(10)
    hand_back(flat, list(zip(params, views)))
    assert all(p.grad is g for p, g in zip(params, (grad, other, vector)))  # parts: copied, not adopted
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


def test_a_whole_gradient_takes_its_part_of_the_buffer_and_a_part_is_copied():
    """A gradient packed whole is not copied back: its parameter's `.grad` becomes the very
    memory the collective wrote (what saves the copy); one packed in part keeps its tensor."""
    params = _with_grads(torch.ones(3, 4), torch.ones(2, 5))
    whole, part = params[0].grad, params[1].grad.narrow(1, 0, 2)
    flat = PackBuffers().pack("k", [whole, part])
    flat.mul_(3)
    kept = params[1].grad
    hand_back(flat, list(zip(params, [whole, part])))
    assert params[0].grad.data_ptr() == flat.data_ptr() and torch.equal(params[0].grad, torch.full((3, 4), 3.0))
    assert params[1].grad is kept and torch.equal(kept[:, :2], torch.full((2, 2), 3.0))
    assert torch.equal(kept[:, 2:], torch.ones(2, 3))
    transposed = _with_grads(torch.ones(4, 3))[0]
    transposed.grad = transposed.grad.t().contiguous().t()  # same elements, not dense in row order
    assert transposed.grad.shape == (4, 3) and not transposed.grad.is_contiguous()
    flat = PackBuffers().pack("t", [transposed.grad])
    before = transposed.grad
    hand_back(flat, [(transposed, transposed.grad)])
    assert transposed.grad is before  # not adopted: a dense buffer part would change its strides
