"""Ring attention across the groups of a replica (context parallelism, DESIGN.md §7.1), uneven.

Each rank holds, inside attention, the queries of its group's whole shard (T_g rows, its own
query heads) and K/V of the same rows (its own kv heads). K/V blocks travel the ring g → g+1;
blocks have the lengths of their groups, and since groups split the kv heads differently, at
every hop a rank sends each member of the next group only the kv heads they share
(`SeqLayout.ring_sends`) and assembles its own from the previous group's pieces. Each
(query shard, key shard) pair is masked by true positions (query pos ≥ key pos); partial
results merge by log-sum-exp. A query row that sees no key of a block (the low half of a
group against a later group's shard) gets that block's lse −inf and weight exactly 0; the
merge starts from the rank's own block, where every row sees itself, so no −inf − −inf
ever happens. Each hop is posted before the block's attention and awaited after it.

The backward pass is explicit, as in ring-flash-attention (zhuzilin) and Megatron's context
parallelism, rather than autograd through the sends: autograd would have to keep every
received block until the backward (all s tokens' K/V), where this keeps only the rank's own
K/V (the ring buffers of DESIGN.md §7.3). The backward sends K/V round the ring again; each
block's gradient follows one hop behind it, summing every group's share, and the last hop
takes it home (ρ = 3 ring passes, 4 with recompute, as §7.2 counts them; but the gradient
pass carries all s rows to each member — the own block's gradient comes home on the last
hop — where §7.2 prices s − T_g: planner/sequence/bridge.py counts what is sent). Each block's share
comes from the flash backward given the *merged* output and log-sum-exp, which is exactly
that block's part of the whole softmax's gradient.

Block kernel: the aten CPU flash-attention op behind `scaled_dot_product_attention` (it returns
the log-sum-exp, which the public SDPA does not); on other devices a plain matmul +
logsumexp kernel with the same contract (on CUDA the memory-efficient SDPA kernel, which
takes a bias and returns the lse, would be the one to wire in; not done without a GPU to
test it on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from runtime.comm import Communicator, PendingExchange

KernelName = Literal["flash_cpu", "math"]
RING_TAG = 4100  # p2p tags of the ring: RING_TAG + 4·step + what (see `_tag`)
HopKind = Literal["kv", "kv_again", "grad"]  # forward K/V, backward K/V, backward K/V gradients


def _tag(step: int, kind: HopKind) -> int:
    """Distinct tags for the hops that may be in flight together between the same two ranks."""
    return RING_TAG + 4 * step + ("kv", "kv_again", "grad").index(kind)


@dataclass
class Hop:
    """A posted ring hop: the pieces arriving from the previous group."""

    pending: PendingExchange
    buffers: list[torch.Tensor]

    def result(self) -> torch.Tensor:
        """Wait for the pieces; the assembled block, kv heads in order."""
        self.pending.wait()
        return torch.cat(self.buffers, dim=3)


def causal_bias(query_pos: torch.Tensor, key_pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[Tq, Tk] additive mask: 0 where the query may see the key (pos ≥ key pos), −inf elsewhere."""
    seen = query_pos[:, None] >= key_pos[None, :]
    return torch.zeros(seen.shape, dtype=dtype, device=query_pos.device).masked_fill(~seen, float("-inf"))


def _flash_cpu_forward(q, k, v, bias):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias)
    return out, lse


def _flash_cpu_backward(grad, q, k, v, out, lse, bias):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, False, attn_mask=bias)


def _math_forward(q, k, v, bias):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # a row with no key: −inf − −inf
    return probs @ v, lse


def _math_backward(grad, q, k, v, out, lse, bias):
    scale = 1 / math.sqrt(q.shape[-1])
    probs = torch.exp((q @ k.transpose(-1, -2)) * scale + bias - lse.unsqueeze(-1))  # merged lse: finite
    dscores = probs * (grad @ v.transpose(-1, -2) - (grad * out).sum(-1, keepdim=True)) * scale
    return dscores @ k, dscores.transpose(-1, -2) @ q, probs.transpose(-1, -2) @ grad


_KERNELS = {"flash_cpu": (_flash_cpu_forward, _flash_cpu_backward), "math": (_math_forward, _math_backward)}


@dataclass(frozen=True)
class RingSpec:
    """What one rank's ring attention needs, fixed per layout (built by `AttentionContext.build`).
    Block s (0 ≤ s < G) is the shard of the group s places back in the ring; block 0 is its own."""

    comm: Communicator
    sends: tuple[tuple[int, int, int], ...]  # (dst rank, first kv head, stop) relative to our kv heads
    recvs: tuple[tuple[int, int], ...]  # (src rank, kv heads), in kv order
    positions: tuple[torch.Tensor, ...]  # true positions of block s's rows
    heads_per_kv: int  # a/k: query heads served by one kv head (GQA)
    kernel: KernelName

    @property
    def steps(self) -> int:
        return len(self.positions)

    def hop(self, blocks: torch.Tensor, step: int, kind: HopKind) -> Hop:
        """Post the send of [c, b, T_s, kv_i, d] (block `step`) on to the next group and the
        receive of block step+1 (cyclic) from the previous one; returns at once."""
        c, b, _, _, d = blocks.shape
        length = len(self.positions[(step + 1) % self.steps])
        buffers = [blocks.new_empty(c, b, length, width, d) for _, width in self.recvs]
        pending = self.comm.exchange([(blocks[:, :, :, lo:hi], dst) for dst, lo, hi in self.sends],
                                     [(buf, src) for buf, (src, _) in zip(buffers, self.recvs)], _tag(step, kind))
        return Hop(pending, buffers)

    def _expand(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[2, b, T, kv_i, d] → k, v as [b, h_i, T, d] (each kv head repeated for its query heads)."""
        k, v = (x.transpose(1, 2).repeat_interleave(self.heads_per_kv, dim=1) for x in kv)
        return k.contiguous(), v.contiguous()

    def block_forward(self, q: torch.Tensor, kv: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of q against block `step` alone; a row that sees no key gets out 0, lse −inf."""
        bias = causal_bias(self.positions[0], self.positions[step], q.dtype)
        out, lse = _KERNELS[self.kernel][0](q, *self._expand(kv), bias)
        blind = torch.isinf(bias).all(dim=-1)  # rows with no key here (the CPU kernel reports lse 0)
        return out.masked_fill(blind[:, None], 0.0), lse.masked_fill(blind, float("-inf"))

    def block_backward(self, grad: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(dq, d[k, v] as [2, b, T, kv_i, d]) of block `step`, given the merged out and lse."""
        bias = causal_bias(self.positions[0], self.positions[step], q.dtype)
        dq, dk, dv = _KERNELS[self.kernel][1](grad, q, *self._expand(kv), out, lse, bias)
        b, _, length, d = dk.shape
        fold = [x.view(b, -1, self.heads_per_kv, length, d).sum(2).transpose(1, 2) for x in (dk, dv)]
        return dq, torch.stack(fold)


def _merge(out, lse, block_out, block_lse):
    """Log-sum-exp merge of two partial softmax results; `lse` finite (block 0 has the diagonal)."""
    if out is None:
        return block_out, block_lse
    merged = torch.logaddexp(lse, block_lse)
    return (out * torch.exp(lse - merged).unsqueeze(-1)
            + block_out * torch.exp(block_lse - merged).unsqueeze(-1)), merged


class RingAttention(torch.autograd.Function):
    """q [b, h_i, T_g, d], kv [2, b, T_g, kv_i, d] → out [b, h_i, T_g, d], exact causal attention
    of the group's rows over the whole sequence (every block of the ring)."""

    @staticmethod
    def forward(fn_ctx, q: torch.Tensor, kv: torch.Tensor, ring: RingSpec) -> torch.Tensor:
        out, lse, block = None, None, kv
        for step in range(ring.steps):
            incoming = ring.hop(block, step, "kv") if step + 1 < ring.steps else None  # overlaps the block
            out, lse = _merge(out, lse, *ring.block_forward(q, block, step))
            if incoming is not None:
                block = incoming.result()
        out = out.to(q.dtype)  # merged in the lse's precision (fp32 for bf16 inputs)
        fn_ctx.save_for_backward(q, kv, out, lse)
        fn_ctx.ring = ring
        return out

    @staticmethod
    def backward(fn_ctx, grad: torch.Tensor):
        q, kv, out, lse = fn_ctx.saved_tensors
        ring, grad = fn_ctx.ring, grad.contiguous()
        # gradients summed over blocks in fp32 whatever the inputs' precision
        dq, block, dblock = torch.zeros_like(q, dtype=torch.float32), kv, torch.zeros_like(kv, dtype=torch.float32)
        for step in range(ring.steps):
            last = step + 1 == ring.steps
            incoming = None if last else ring.hop(block, step, "kv_again")  # overlaps the block
            dq_step, dkv_step = ring.block_backward(grad, q, block, out, lse, step)
            dq, dblock = dq + dq_step, dblock + dkv_step
            if ring.steps > 1:  # the gradient follows its block; the last hop takes it home
                dblock = ring.hop(dblock, step, "grad").result()
            if incoming is not None:
                block = incoming.result()
        return dq.to(q.dtype), dblock.to(kv.dtype), None
