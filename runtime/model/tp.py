"""Megatron-style tensor parallelism as autograd functions over an explicit TP group.

- `copy_to_tp` (Megatron's f): identity forward, all-reduce of the gradient backward — put
  before column-parallel linears, whose input is replicated.
- `reduce_from_tp` (Megatron's g): all-reduce forward, identity backward — after
  row-parallel linears and the vocab-parallel embedding, whose outputs are partial sums.
- `vocab_parallel_embedding` and `vocab_parallel_cross_entropy`: the vocabulary is split in
  contiguous blocks; neither ever materialises the full [tokens, V] logits on one rank.
- Sequence parallelism (Megatron's, docs/cost-model.md §3.5): outside the matrix products a
  rank keeps its 1/t of the sequence (dim 1 of [b, s, h]); `gather_sequence` (all-gather
  forward, reduce-scatter backward) replaces f, `scatter_sequence` (reduce-scatter forward,
  all-gather backward) replaces g: the same volume as the all-reduce they split.
Every function takes the communicator and the TP group, and every collective goes through
the communicator (`runtime.communication.communicator`). A group of None means TP size 1: every function reduces
to the plain operation (and needs no communicator).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.communication.communicator import Communicator, Group


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm: Communicator, group: Group):
        ctx.comm, ctx.group = comm, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad.contiguous().clone(), ctx.group), None, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm: Communicator, group: Group):
        return comm.all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def _seq_all_gather(x: torch.Tensor, comm: Communicator, group: Group) -> torch.Tensor:
    """[b, s/t, ...] of every rank → [b, s, ...] in the group's rank order."""
    return torch.cat(comm.all_gather(x.contiguous(), group), dim=1)


def _seq_reduce_scatter(x: torch.Tensor, comm: Communicator, group: Group) -> torch.Tensor:
    """Partial sums [b, s, ...] → this rank's block [b, s/t, ...] of their sum (the
    communicator cuts dim 0, so the sequence goes first for the collective)."""
    return comm.reduce_scatter(x.transpose(0, 1).contiguous(), group).transpose(0, 1).contiguous()


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm: Communicator, group: Group):
        ctx.comm, ctx.group = comm, group
        return _seq_all_gather(x, comm, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_reduce_scatter(grad, ctx.comm, ctx.group), None, None


class _ScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm: Communicator, group: Group):
        ctx.comm, ctx.group = comm, group
        return _seq_reduce_scatter(x, comm, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_all_gather(grad, ctx.comm, ctx.group), None, None


def gather_sequence(x: torch.Tensor, comm: Communicator | None, group: Group | None) -> torch.Tensor:
    """Sequence parallelism's f: this rank's tokens → every token (before column-parallel linears)."""
    return x if group is None else _GatherSequence.apply(x, comm, group)


def scatter_sequence(x: torch.Tensor, comm: Communicator | None, group: Group | None) -> torch.Tensor:
    """Sequence parallelism's g: partial sums of every token → the sum on this rank's tokens."""
    return x if group is None else _ScatterSequence.apply(x, comm, group)


def copy_to_tp(x: torch.Tensor, comm: Communicator | None, group: Group | None) -> torch.Tensor:
    return x if group is None else _CopyToTP.apply(x, comm, group)


def reduce_from_tp(x: torch.Tensor, comm: Communicator | None, group: Group | None) -> torch.Tensor:
    return x if group is None else _ReduceFromTP.apply(x, comm, group)


def vocab_parallel_embedding(tokens: torch.Tensor, weight: torch.Tensor, vocab_start: int,
                             comm: Communicator | None, group: Group | None,
                             sequence_parallel: bool = False) -> torch.Tensor:
    """Look up the ids in this rank's vocabulary block [vocab_start, vocab_start + V/t); the
    others contribute zeros, and the all-reduce assembles every embedding (with sequence
    parallelism a reduce-scatter: this rank's tokens only)."""
    if group is None:
        return F.embedding(tokens, weight)
    local = tokens - vocab_start
    outside = (local < 0) | (local >= weight.shape[0])
    out = F.embedding(local.masked_fill(outside, 0), weight) * (~outside).unsqueeze(-1)
    return scatter_sequence(out, comm, group) if sequence_parallel else reduce_from_tp(out, comm, group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss −log softmax(logits)[target] with logits split over the vocabulary, in
    one collective: each rank gathers every block's (max, Σ exp(logit − max), target logit
    or 0), from which every rank forms the global log-sum-exp. (Megatron's three
    all-reduces — max, target, sum — pay the latency three times, and that latency is most
    of what these [tokens]-sized messages cost.)"""

    @staticmethod
    def forward(ctx, logits, targets, vocab_start, comm: Communicator, group: Group):
        local_max = logits.max(dim=-1).values
        exp = (logits - local_max.unsqueeze(-1)).exp()
        local = targets - vocab_start
        outside = (local < 0) | (local >= logits.shape[-1])
        local = local.masked_fill(outside, 0)
        picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        maxes, sums, targets_logit = torch.stack(comm.all_gather(torch.stack((local_max, exp.sum(-1), picked)),
                                                                 group)).unbind(1)
        top = maxes.max(dim=0).values
        sum_exp = (sums * (maxes - top).exp()).sum(dim=0)
        # this block's softmax: exp(logit − local max) rescaled to the global max and sum
        ctx.save_for_backward(exp.mul_(((local_max - top).exp() / sum_exp).unsqueeze(-1)), local, outside)
        return sum_exp.log() + top - targets_logit.sum(dim=0)

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        grad_logits = softmax.clone()
        grad_logits.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(softmax.dtype).unsqueeze(-1))
        return grad_logits * grad.unsqueeze(-1), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int,
                                 comm: Communicator | None, group: Group | None) -> torch.Tensor:
    """Per-token losses, same shape as `targets`; logits: [..., V/t] of this rank's block."""
    if group is None:
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none").view_as(targets)
    return _VocabParallelCrossEntropy.apply(logits, targets, vocab_start, comm, group)
