"""Attention of a sequence plan: uneven Ulysses head parallelism inside a group around uneven
ring attention across the groups of a replica (docs/sequence-plans.md §7.1, §7.2).

Outside attention, member i of a group holds t_i tokens of the group's shard with every head;
inside, it holds all T_g tokens of the shard with its own heads_i query heads and kv_i kv heads
(whole kv heads, so GQA needs no exchange of its own). One uneven all-to-all moves q, k and v
from the first arrangement to the second, `runtime.sequence.ring` attends over the whole
sequence, and a second all-to-all brings the output back. Both all-to-alls are autograd
functions whose backward is the reverse all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from runtime.communication.communicator import Communicator, Group
from runtime.sequence.layout import SeqLayout, Span
from runtime.sequence.ring import KernelName, RingAttention, RingSpec


class _AllToAll(torch.autograd.Function):
    """Uneven all-to-all of a flat tensor over the HP group; its gradient goes back the same way."""

    @staticmethod
    def forward(fn_ctx, flat: torch.Tensor, comm: Communicator, group: Group, send_sizes: list[int],
                recv_sizes: list[int]) -> torch.Tensor:
        fn_ctx.route = (comm, group, send_sizes, recv_sizes)
        return comm.all_to_all(flat, send_sizes=send_sizes, recv_sizes=recv_sizes, group=group)

    @staticmethod
    def backward(fn_ctx, grad: torch.Tensor):
        comm, group, send_sizes, recv_sizes = fn_ctx.route
        return comm.all_to_all(grad, send_sizes=recv_sizes, recv_sizes=send_sizes, group=group), None, None, None, None


@dataclass(frozen=True)
class AttentionContext:
    """One rank's fixed view of its sequence-plan attention: its HP group's split of tokens and
    heads, and its ring (see `build`)."""

    comm: Communicator
    hp_group: Group | None  # None when the group has one member
    member: int  # this rank's index in its group
    tokens: tuple[int, ...]  # t_j of every member of the group
    heads: tuple[Span, ...]  # query heads of every member
    kv: tuple[Span, ...]  # kv heads of every member
    num_heads: int  # a
    num_kv_heads: int  # k
    ring: RingSpec

    @classmethod
    def build(cls, *, layout: SeqLayout, rank: int, comm: Communicator, hp_group: Group | None,
              kernel: Literal["auto"] | KernelName = "auto") -> AttentionContext:
        """The context of `rank` (built once per rank, before the first step). `hp_group` is the
        communicator group of the rank's group (`SeqLayout.hp_group_keys`), None for a group of
        one. `kernel` picks the block kernel: `auto` is the CPU flash kernel on CPU and the
        matmul kernel elsewhere."""
        group, me = layout.group_of(rank), layout.rank(rank)
        if len(group.ranks) > 1 and (hp_group is None or hp_group.ranks != group.ranks):
            raise ValueError(f"rank {rank}: the HP group must be ranks {group.ranks}, "
                             f"got {None if hp_group is None else hp_group.ranks}")
        members = [layout.rank(r) for r in group.ranks]
        kv_start = me.kv[0]
        ring = RingSpec(
            comm=comm, heads_per_kv=layout.heads // layout.kv_heads,
            sends=tuple((dst, lo - kv_start, hi - kv_start) for dst, (lo, hi) in layout.ring_sends(rank)),
            recvs=tuple((src, hi - lo) for src, (lo, hi) in layout.ring_recvs(rank)),
            positions=tuple(torch.as_tensor(ring_group.positions(), device=comm.device)
                            for ring_group in _blocks_in_arrival_order(layout, rank)),
            kernel=("flash_cpu" if comm.device.type == "cpu" else "math") if kernel == "auto" else kernel)
        return cls(comm=comm, hp_group=hp_group if len(group.ranks) > 1 else None, member=me.member,
                   tokens=tuple(m.num_tokens for m in members), heads=tuple(m.heads for m in members),
                   kv=tuple(m.kv for m in members), num_heads=layout.heads, num_kv_heads=layout.kv_heads, ring=ring)

    def all_to_all(self, chunks: list[torch.Tensor], recv_shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Send chunks[j] to member j; the piece from each member j, shaped recv_shapes[j]."""
        send_sizes = [c.numel() for c in chunks]
        recv_sizes = [int(torch.Size(s).numel()) for s in recv_shapes]
        flat = _AllToAll.apply(torch.cat([c.reshape(-1) for c in chunks]), self.comm, self.hp_group,
                               send_sizes, recv_sizes)
        return [piece.view(shape) for piece, shape in zip(flat.split(recv_sizes), recv_shapes)]


def _blocks_in_arrival_order(layout: SeqLayout, rank: int):
    """The groups whose K/V this rank attends to, in the order the ring brings them (own first)."""
    ring, g = layout.ring_of(rank), layout.rank(rank).group
    return [ring[(g - step) % len(ring)] for step in range(len(ring))]


def _to_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext):
    """Sequence-sharded [b, t_i, a|k, d] → head-sharded [b, T_g, heads_i|kv_i, d] (Ulysses)."""
    if ctx.hp_group is None:
        return q, k, v
    b, d, me = q.shape[0], q.shape[-1], ctx.member
    (h0, h1), (k0, k1) = ctx.heads[me], ctx.kv[me]
    chunks = [torch.cat([q[:, :, hs:he], k[:, :, ks:ke], v[:, :, ks:ke]], dim=2)
              for (hs, he), (ks, ke) in zip(ctx.heads, ctx.kv)]
    pieces = ctx.all_to_all(chunks, [(b, t, h1 - h0 + 2 * (k1 - k0), d) for t in ctx.tokens])
    whole = torch.cat(pieces, dim=1)  # the group's tokens, in member order
    return whole.split([h1 - h0, k1 - k0, k1 - k0], dim=2)


def _to_tokens(out: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """Head-sharded [b, T_g, heads_i, d] → sequence-sharded [b, t_i, a, d] (Ulysses, back)."""
    if ctx.hp_group is None:
        return out
    b, d, t_me = out.shape[0], out.shape[-1], ctx.tokens[ctx.member]
    chunks = list(out.split(list(ctx.tokens), dim=1))
    pieces = ctx.all_to_all(chunks, [(b, t_me, he - hs, d) for hs, he in ctx.heads])
    return torch.cat(pieces, dim=2)


def sequence_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, ctx: AttentionContext) -> torch.Tensor:
    """This member's rows of causal attention over the whole sequence (differentiable).

    q: [b, t_i, a, d], k and v: [b, t_i, k, d] — this member's tokens, every head, rotary
    already applied at the true positions. Returns [b, t_i, a·d], like
    `runtime.model.llama.causal_attention` on the whole sequence restricted to these rows."""
    t_me = ctx.tokens[ctx.member]
    if q.shape[1:3] != (t_me, ctx.num_heads) or k.shape[1:3] != (t_me, ctx.num_kv_heads) or k.shape != v.shape:
        raise ValueError(f"sequence_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         f"for {t_me} tokens, {ctx.num_heads} heads, {ctx.num_kv_heads} kv heads")
    q_heads, k_heads, v_heads = _to_heads(q, k, v, ctx)
    out = RingAttention.apply(q_heads.transpose(1, 2).contiguous(), torch.stack([k_heads, v_heads]), ctx.ring)
    return _to_tokens(out.transpose(1, 2), ctx).flatten(2)
