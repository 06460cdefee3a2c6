"""Ring attention's blocks (runtime.sequence.blocks): on every layout the runtime makes, the
kernels attend exactly the causal pairs — no masked pair computed, none missed — and a block
of any other shape, attended with its position mask, equals masked softmax attention computed
directly (output, log-sum-exp and the gradients), on both kernels."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from runtime.sequence.blocks import BlockShape, attend, attend_backward
from runtime.sequence.layout import seq_rank_layout
from seq_layouts import seq_plans


def _computed_pairs(shape: BlockShape) -> int:
    """Pairs the kernel computes: the causal triangle, a dense rectangle or a masked one."""
    rows, cols = shape.rows.stop - shape.rows.start, shape.cols.stop - shape.cols.start
    return rows * (rows + 1) // 2 if shape.mode == "causal" else rows * cols


@settings(max_examples=60, deadline=None, derandomize=True)
@given(drawn=seq_plans(max_ranks=8, max_groups=4))
def test_mirrored_layouts_attend_exactly_the_causal_pairs(drawn):
    plan, kv_heads = drawn
    layout = seq_rank_layout(plan, kv_heads=kv_heads)
    s = layout.seq_len
    for replica in layout.replicas:
        total = 0
        for g, group in enumerate(replica.groups):
            query = torch.as_tensor(group.positions())
            ring = [replica.groups[(g - step) % len(replica.groups)] for step in range(len(replica.groups))]
            for step, other in enumerate(ring):
                key = torch.as_tensor(other.positions())
                shape = BlockShape.of(query, key, torch.float32)
                assert shape.mode == ("causal" if step == 0 else "dense"), (g, step, shape)
                visible = int((query[:, None] >= key[None, :]).sum())
                assert _computed_pairs(shape) == visible, (g, step, shape)
                total += visible
        assert total == s * (s + 1) // 2  # every causal pair of the sequence, once


def _reference(q, k, v, query_pos, key_pos):
    """Masked softmax attention in fp64 (rows that see no key: out 0, lse −inf)."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~(query_pos[:, None] >= key_pos[None, :]), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    return probs @ v, lse


CASES = {
    "own block": (torch.arange(10), torch.arange(10), "causal"),
    "earlier half of the keys": (torch.tensor([2, 3, 4, 13, 14]), torch.tensor([0, 1, 18, 19]), "dense"),
    "later half of the queries": (torch.tensor([0, 1, 18, 19]), torch.tensor([2, 3, 4, 13, 14]), "dense"),
    "shuffled positions": (torch.tensor([5, 0, 9, 2, 7, 3]), torch.tensor([4, 8, 1, 6, 0]), "masked"),
    "a row range that sees part": (torch.tensor([0, 1, 2, 6, 7]), torch.tensor([3, 5, 6, 1]), "masked"),
    "sees nothing": (torch.tensor([0, 1, 2]), torch.tensor([5, 6]), "masked"),
}


@pytest.mark.parametrize("kernel", ["flash_cpu", "math"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_block_equals_masked_attention(kernel, case):
    query_pos, key_pos, mode = CASES[case]
    shape = BlockShape.of(query_pos, key_pos, torch.float32)
    assert shape.mode == mode
    gen = torch.Generator().manual_seed(len(case))
    q, k, v = (torch.randn(2, 3, n, 4, generator=gen) for n in (len(query_pos), len(key_pos), len(key_pos)))
    want_out, want_lse = _reference(*(x.double() for x in (q, k, v)), query_pos, key_pos)
    rows_out, rows_lse = attend(kernel, shape, q, k, v)
    out = torch.zeros_like(want_out)
    lse = torch.full_like(want_lse, float("-inf"))
    out[:, :, shape.rows], lse[:, :, shape.rows] = rows_out.double(), rows_lse.double()
    assert torch.allclose(out, want_out, atol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    seen = ~torch.isinf(want_lse)
    assert torch.allclose(lse[seen], want_lse[seen], atol=1e-5)
    if not seen.any():
        return  # no gradient flows through a block that no row sees
    full = [x.double().requires_grad_() for x in (q, k, v)]
    grad = torch.randn(out.shape, generator=gen)
    (_reference(*full, query_pos, key_pos)[0] * grad.double()).sum().backward()
    # a ring's backward is given the merged out and lse; with one block they are its own
    safe_lse = torch.where(seen, lse, torch.zeros_like(lse)).float()
    dq_rows, dk, dv = attend_backward(kernel, shape, grad, q, k, v, out.float().contiguous(), safe_lse)
    dq = torch.zeros_like(q)
    dq[:, :, shape.rows] = dq_rows
    for got, want in ((dq, full[0].grad), (dk, full[1].grad[:, :, shape.cols]), (dv, full[2].grad[:, :, shape.cols])):
        assert torch.allclose(got.double(), want, atol=1e-5)
    outside = torch.ones(len(key_pos), dtype=torch.bool)
    outside[shape.cols] = False
    assert not full[1].grad[:, :, outside].any() and not full[2].grad[:, :, outside].any()
