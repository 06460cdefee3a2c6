"""Megatron-style tensor parallelism as autograd functions over an explicit TP group.

- `copy_to_tp` (Megatron's f): identity forward, all-reduce of the gradient backward — put
  before column-parallel linears, whose input is replicated.
- `reduce_from_tp` (Megatron's g): all-reduce forward, identity backward — after
  row-parallel linears and the vocab-parallel embedding, whose outputs are partial sums.
- `vocab_parallel_embedding` and `vocab_parallel_cross_entropy`: the vocabulary is split in
  contiguous blocks; neither ever materialises the full [tokens, V] logits on one rank.
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


def copy_to_tp(x: torch.Tensor, comm: Communicator | None, group: Group | None) -> torch.Tensor:
    return x if group is None else _CopyToTP.apply(x, comm, group)


def reduce_from_tp(x: torch.Tensor, comm: Communicator | None, group: Group | None) -> torch.Tensor:
    return x if group is None else _ReduceFromTP.apply(x, comm, group)


def vocab_parallel_embedding(tokens: torch.Tensor, weight: torch.Tensor, vocab_start: int,
                             comm: Communicator | None, group: Group | None) -> torch.Tensor:
    """Look up the ids in this rank's vocabulary block [vocab_start, vocab_start + V/t); the
    others contribute zeros, and the all-reduce assembles every embedding."""
    if group is None:
        return F.embedding(tokens, weight)
    local = tokens - vocab_start
    outside = (local < 0) | (local >= weight.shape[0])
    out = F.embedding(local.masked_fill(outside, 0), weight) * (~outside).unsqueeze(-1)
    return reduce_from_tp(out, comm, group)


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
