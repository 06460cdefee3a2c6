"""One block of ring attention: a rank's queries against one group's K/V, computed on the part
the causal mask lets through (docs/sequence-plans.md §7.1, §7.2).

The mirrored layout makes every block one of two kinds. The rank's own block has the same
positions for queries and keys, in increasing order, so the position mask is the plain causal
mask of the kernel (`is_causal`), which skips the masked half. Against another group each half
of the queries sees either all of a half of the keys or none of it: the block's visible part is
one dense rectangle (all queries × the earlier half of the keys, or the later half of the
queries × all keys), attended without a mask. Either way the kernel does the causal pairs
§7.2 prices (pairs_g), not the whole square. A block of any other shape (positions that no
layout of this runtime produces, kept so that `RingSpec` is correct for any positions) is
attended over the rectangle of rows and keys that see something, with the position mask.

Kernels: the aten CPU flash-attention op behind `scaled_dot_product_attention` (it returns the
log-sum-exp, which the public SDPA does not); on other devices a plain matmul + logsumexp
kernel with the same contract (on CUDA the memory-efficient SDPA kernel, which takes a bias
and returns the lse, would be the one to wire in; not done without a GPU to test it on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

KernelName = Literal["flash_cpu", "math"]
BlockMode = Literal["causal", "dense", "masked"]


def causal_bias(query_pos: torch.Tensor, key_pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[Tq, Tk] additive mask: 0 where the query may see the key (pos ≥ key pos), −inf elsewhere."""
    seen = query_pos[:, None] >= key_pos[None, :]
    return torch.zeros(seen.shape, dtype=dtype, device=query_pos.device).masked_fill(~seen, float("-inf"))


@dataclass(frozen=True)
class BlockShape:
    """What of (queries × one block's keys) the causal mask lets through: query rows `rows`
    against keys `cols`, attended as `mode` says (`bias` for "masked" only). Rows outside
    `rows` see no key of the block."""

    mode: BlockMode
    rows: slice
    cols: slice
    bias: torch.Tensor | None = None

    @classmethod
    def of(cls, query_pos: torch.Tensor, key_pos: torch.Tensor, dtype: torch.dtype) -> BlockShape:
        everything = slice(0, len(query_pos)), slice(0, len(key_pos))
        if torch.equal(query_pos, key_pos) and bool((query_pos[1:] > query_pos[:-1]).all()):
            return cls("causal", *everything)
        seen = query_pos[:, None] >= key_pos[None, :]
        rows, cols = _span(seen.any(dim=1)), _span(seen.any(dim=0))
        if rows is None or cols is None:  # sees nothing: the masked kernel reports every row blind
            return cls("masked", *everything, causal_bias(query_pos, key_pos, dtype))
        if bool(seen[rows, cols].all()):
            return cls("dense", rows, cols)
        return cls("masked", rows, cols, causal_bias(query_pos[rows], key_pos[cols], dtype))


def _span(flags: torch.Tensor) -> slice | None:
    """The smallest index range holding every True of `flags` (None if there is none)."""
    where = torch.nonzero(flags).flatten()
    return None if len(where) == 0 else slice(int(where[0]), int(where[-1]) + 1)


def attend(kernel: KernelName, shape: BlockShape, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q [b, h, Tq, d] against k, v [b, h, Tk, d] on `shape`'s rows alone: out
    [b, h, rows, d], lse [b, h, rows]; a row that sees no key gets out 0, lse −inf."""
    rows, cols = shape.rows, shape.cols
    forward = _flash_cpu_forward if kernel == "flash_cpu" else _math_forward
    out, lse = forward(q[:, :, rows], k[:, :, cols], v[:, :, cols], _bias(shape, q), shape.mode == "causal")
    if shape.mode != "masked":
        return out, lse
    blind = torch.isinf(shape.bias).all(dim=-1)  # rows with no key here (the CPU kernel reports lse 0)
    return out.masked_fill(blind[:, None], 0.0), lse.masked_fill(blind, float("-inf"))


def attend_backward(kernel: KernelName, shape: BlockShape, grad, q, k, v, out, lse):
    """(dq on `shape`'s rows, dk and dv on its keys) of the block, given the merged out and
    lse of every row (the softmax over all blocks)."""
    rows, cols = shape.rows, shape.cols
    backward = _flash_cpu_backward if kernel == "flash_cpu" else _math_backward
    return backward(grad[:, :, rows], q[:, :, rows], k[:, :, cols], v[:, :, cols], out[:, :, rows],
                    lse[:, :, rows], _bias(shape, q), shape.mode == "causal")


def _bias(shape: BlockShape, q: torch.Tensor) -> torch.Tensor | None:
    return None if shape.bias is None else shape.bias.to(q.dtype)


def _flash_cpu_forward(q, k, v, bias, causal: bool):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias)


def _flash_cpu_backward(grad, q, k, v, out, lse, bias, causal: bool):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, causal, attn_mask=bias)


def _math_bias(q, k, bias, causal: bool):
    if not causal:
        return bias
    above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    return torch.zeros(above.shape, dtype=q.dtype, device=q.device).masked_fill(above, float("-inf"))


def _math_forward(q, k, v, bias, causal: bool):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    bias = _math_bias(q, k, bias, causal)
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # a row with no key: −inf − −inf
    return probs @ v, lse


def _math_backward(grad, q, k, v, out, lse, bias, causal: bool):
    scale = 1 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)) * scale
    bias = _math_bias(q, k, bias, causal)
    if bias is not None:
        scores = scores + bias
    probs = torch.exp(scores - lse.unsqueeze(-1))  # merged lse: finite
    dscores = probs * (grad @ v.transpose(-1, -2) - (grad * out).sum(-1, keepdim=True)) * scale
    return dscores @ k, dscores.transpose(-1, -2) @ q, probs.transpose(-1, -2) @ grad
