"""Ring attention across the groups of a replica (context parallelism, docs/sequence-plans.md §7.1), uneven.

Each rank holds, inside attention, the queries of its group's whole shard (T_g rows, its own
query heads) and K/V of the same rows (its own kv heads). K/V blocks travel the ring g → g+1;
blocks have the lengths of their groups, and since groups split the kv heads differently, at
every hop a rank sends each member of the next group only the kv heads they share
(`SeqLayout.ring_sends`) and assembles its own from the previous group's pieces. Each
(query shard, key shard) block is attended on the part the causal mask (query pos ≥ key
pos) lets through (`runtime.sequence.blocks`): the own block as plain causal attention, every
other block as one dense rectangle — half the queries against the block, or every query
against half of it —, so no masked pair is computed. Partial results merge by log-sum-exp
into the rows that saw the block; the merge starts from the rank's own block, where every
row sees itself, so the lse stays finite and no −inf − −inf ever happens. Each hop is
posted before the block's attention and awaited after it.

The backward pass is explicit, as in ring-flash-attention (zhuzilin) and Megatron's context
parallelism, rather than autograd through the sends: autograd would have to keep every
received block until the backward (all s tokens' K/V), where this keeps only the rank's own
K/V (the ring buffers of docs/sequence-plans.md §7.3). The backward sends K/V round the ring again; each
block's gradient follows one hop behind it, summing every group's share, and the last hop
takes it home (ρ = 3 ring passes, 4 with recompute, as §7.2 counts them; but the gradient
pass carries all s rows to each member — the own block's gradient comes home on the last
hop — where §7.2 prices s − T_g: planner/sequence/bridge.py counts what is sent). Each block's share
comes from the flash backward given the *merged* output and log-sum-exp, which is exactly
that block's part of the whole softmax's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch

from runtime.communication.communicator import Communicator, PendingExchange
from runtime.sequence.blocks import BlockShape, KernelName, attend, attend_backward

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

    @cached_property
    def shapes(self) -> tuple[BlockShape, ...]:
        """What of each block the causal mask lets this rank's queries see (found once)."""
        return tuple(BlockShape.of(self.positions[0], pos, torch.get_default_dtype()) for pos in self.positions)

    def block_forward(self, q: torch.Tensor, kv: torch.Tensor, step: int) -> tuple[slice, torch.Tensor, torch.Tensor]:
        """(rows, out, lse) of q against block `step` alone, on the rows that see a key of it."""
        shape = self.shapes[step]
        out, lse = attend(self.kernel, shape, q, *self._expand(kv))
        return shape.rows, out, lse

    def block_backward(self, grad: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, step: int, dq: torch.Tensor, dkv: torch.Tensor) -> None:
        """Add block `step`'s share of the gradients, given the merged out and lse, to dq
        [b, h_i, T_g, d] and to the block's dkv [2, b, T, kv_i, d]."""
        shape = self.shapes[step]
        dq_rows, dk, dv = attend_backward(self.kernel, shape, grad, q, *self._expand(kv), out, lse)
        b, _, length, d = dk.shape
        fold = [x.view(b, -1, self.heads_per_kv, length, d).sum(2).transpose(1, 2) for x in (dk, dv)]
        dq[:, :, shape.rows] += dq_rows
        dkv[:, :, shape.cols] += torch.stack(fold)


def _merge(out, lse, rows: slice, block_out, block_lse) -> None:
    """Log-sum-exp merge of a block's partial softmax result into `rows` of (out, lse), in
    place; `lse` finite (block 0, merged first, has the diagonal)."""
    merged = torch.logaddexp(lse[:, :, rows], block_lse)
    out[:, :, rows] = (out[:, :, rows] * torch.exp(lse[:, :, rows] - merged).unsqueeze(-1)
                       + block_out * torch.exp(block_lse - merged).unsqueeze(-1))
    lse[:, :, rows] = merged


class RingAttention(torch.autograd.Function):
    """q [b, h_i, T_g, d], kv [2, b, T_g, kv_i, d] → out [b, h_i, T_g, d], exact causal attention
    of the group's rows over the whole sequence (every block of the ring)."""

    @staticmethod
    def forward(fn_ctx, q: torch.Tensor, kv: torch.Tensor, ring: RingSpec) -> torch.Tensor:
        out, lse, block = None, None, kv
        for step in range(ring.steps):
            incoming = ring.hop(block, step, "kv") if step + 1 < ring.steps else None  # overlaps the block
            rows, block_out, block_lse = ring.block_forward(q, block, step)
            if out is None:  # the own block: every row; merged on in the lse's precision (fp32 for bf16)
                out, lse = block_out.to(block_lse.dtype, copy=True), block_lse.clone()
            else:
                _merge(out, lse, rows, block_out, block_lse)
            if incoming is not None:
                block = incoming.result()
        out = out.to(q.dtype)
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
            ring.block_backward(grad, q, block, out, lse, step, dq, dblock)
            if ring.steps > 1:  # the gradient follows its block; the last hop takes it home
                dblock = ring.hop(dblock, step, "grad").result()
            if incoming is not None:
                block = incoming.result()
        return dq.to(q.dtype), dblock.to(kv.dtype), None
