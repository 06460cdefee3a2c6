"""Asymmetric data-parallel gradient sync (docs/cost-model.md §3.4, docs/solvers.md §6).

For each parameter unit (embedding, layer, head) the holders in the D pipelines may shard it
over TP groups of different sizes. Every holder cuts its shard into chunks of the finest
shard size; chunk c has exactly one owner per pipeline (`ChunkGroup.ranks`) and the owners
all-reduce it. Chunks that go to the same rank set are packed into one flat buffer so that a
rank issues one all-reduce per distinct partner set, in the layout's one global order (which
makes the blocking collectives deadlock-free). Replicated parameters (norm weights) travel
in chunk 0, whose owner is the stage leader, which then broadcasts them in its TP group.
Tied embeddings (docs/cost-model.md §3.4) leave the DP sync: every first stage's embedding
and every last stage's head are copies of one matrix, and each vocabulary chunk is summed
over all its holders at once (`layout.tied_groups`: both uses and every pipeline), so the
copies start equal and stay equal, as Megatron keeps its two copies.
With sequence parallelism the norm weights' gradients are first summed over the TP group
(each rank's norms saw only its tokens); with ZeRO-1 (docs/checkpoints.md §11) the chunks are
reduce-scattered by `runtime.layered.optimizer` instead of all-reduced.
Every collective goes through the communicator (`runtime.communication.communicator`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from runtime.communication.communicator import Communicator, Group, ReduceOpName
from runtime.layered.groups import RankGroups
from runtime.layered.optimizer import StageOptimizer
from runtime.layered.stage import StageModel
from runtime.model.llama import EMBEDDING, HEAD
from runtime.communication.packing import PackBuffers, hand_back


class Piece(NamedTuple):
    """A view of a parameter's gradient (or data) that one collective carries, and the parameter."""

    param: torch.nn.Parameter
    view: torch.Tensor


def _chunk_pieces(model: StageModel, groups: RankGroups, grads: bool) -> dict[tuple[int, ...], list[Piece]]:
    """Rank set → the pieces (views of gradients or parameters, with their parameters) this
    rank syncs with it, in order."""
    stage, pieces = groups.stage, {}
    for group in groups.layout.chunk_groups:
        if groups.rank not in group.ranks or len(group.ranks) == 1:
            continue
        per_rank = group.num_chunks // stage.tp  # chunks in each TP rank's shard
        local_chunk = group.chunk - groups.tp_rank * per_rank
        for name, param, dim in model.unit_shards(group.unit):
            if model.spec.tied_embeddings and name in (EMBEDDING, HEAD):
                continue  # summed over the tied groups instead
            tensor = param.grad if grads else param.data
            if dim is None:
                if group.chunk == 0:
                    pieces.setdefault(group.ranks, []).append(Piece(param, tensor))
                continue
            size = tensor.shape[dim] // per_rank
            pieces.setdefault(group.ranks, []).append(Piece(param, tensor.narrow(dim, local_chunk * size, size)))
    return pieces


def _replicated(model: StageModel, grads: bool) -> list[Piece]:
    units = model.stage.units(model.spec.layers)
    return [Piece(p, p.grad if grads else p.data) for u in units for _, p, dim in model.unit_shards(u) if dim is None]


def _views(pieces: list[Piece]) -> list[torch.Tensor]:
    return [piece.view for piece in pieces]


def _all_reduce_views(comm: Communicator, views: list[torch.Tensor], group: Group,
                      op: ReduceOpName = "sum") -> list[torch.Tensor]:
    flat = torch.cat([v.reshape(-1) for v in views])
    comm.all_reduce(flat, group, op)
    return list(flat.split([v.numel() for v in views]))


def _tied_pieces(model: StageModel, groups: RankGroups, grads: bool) -> dict[tuple[int, ...], list[list[torch.Tensor]]]:
    """Tied group's rank set → per chunk this rank holds, the views of its copies (the
    embedding's, the head's, or both on a stage that is first and last)."""
    stage, out = groups.stage, {}
    copies = [model.p(name) for name, held in ((EMBEDDING, stage.first), (HEAD, stage.last)) if held]
    for group in groups.layout.tied_groups:
        if groups.rank not in group.ranks:
            continue
        per_rank = group.num_chunks // stage.tp
        local = group.chunk - groups.tp_rank * per_rank
        tensors = [p.grad if grads else p.data for p in copies]
        rows = tensors[0].shape[0] // per_rank
        out.setdefault(group.ranks, []).append([t.narrow(0, local * rows, rows) for t in tensors])
    return out


def sync_tied(comm: Communicator, model: StageModel, groups: RankGroups) -> None:
    """Every copy of the tied matrix gets the sum of all copies' gradients (all pipelines)."""
    for key, chunks in sorted(_tied_pieces(model, groups, grads=True).items()):
        summed = torch.cat([sum(views[1:], views[0].clone()).reshape(-1) for views in chunks])
        if len(key) > 1:
            comm.all_reduce(summed, groups.tied[key])
        for views, total in zip(chunks, summed.split([views[0].numel() for views in chunks])):
            for view in views:
                view.copy_(total.view_as(view))


def sync_sequence_parallel(comm: Communicator, model: StageModel, groups: RankGroups) -> None:
    """With sequence parallelism each TP rank's norm weights saw only its own tokens: their
    gradients are summed over the TP group (as Megatron sums its sequence-parallel weights')."""
    views = _views(_replicated(model, grads=True))
    for view, total in zip(views, _all_reduce_views(comm, views, groups.tp)):
        view.copy_(total.view_as(view))


def sync_gradients(comm: Communicator, model: StageModel, groups: RankGroups, buffers: PackBuffers,
                   optimizer: StageOptimizer | None = None) -> None:
    """Sum every gradient across pipelines (one call per step, after accumulation), packed
    into `buffers` (kept between steps); the tied embeddings' copies first. With ZeRO-1
    (`optimizer.zero`) each chunk's gradient is reduce-scattered into its owners' blocks
    instead (the optimizer's step then gathers the weights)."""
    if model.spec.tied_embeddings:
        sync_tied(comm, model, groups)
    if model.sequence_parallel:
        sync_sequence_parallel(comm, model, groups)
    if groups.layout.num_pipelines == 1:
        return
    if optimizer is not None and optimizer.zero:
        optimizer.reduce_scatter(comm)
        return
    pieces = _chunk_pieces(model, groups, grads=True)
    for key in groups.layout.dp_group_keys():
        if key in pieces:
            summed = comm.all_reduce(buffers.pack(key, _views(pieces[key])), groups.dp[key])
            hand_back(summed, pieces[key])
    if groups.tp is not None:
        replicated = _replicated(model, grads=True)
        sent = comm.broadcast(buffers.pack("replicated", _views(replicated)), groups.stage.leader, groups.tp)
        hand_back(sent, replicated)


def replicas_identical(comm: Communicator, model: StageModel, groups: RankGroups) -> bool:
    """True iff every chunk this rank holds equals, bit for bit, the same chunk in every
    other pipeline, and its replicated parameters equal those of its TP group."""
    pieces, ok = _chunk_pieces(model, groups, grads=False), True
    for key in groups.layout.dp_group_keys():
        if key in pieces:
            ok &= _same_everywhere(comm, _views(pieces[key]), groups.dp[key])
    if model.spec.tied_embeddings:  # a stage's two copies alike, then every holder's
        for key, chunks in sorted(_tied_pieces(model, groups, grads=False).items()):
            ok &= all(torch.equal(view, views[0]) for views in chunks for view in views)
            if len(key) > 1:
                ok &= _same_everywhere(comm, [views[0] for views in chunks], groups.tied[key])
    if groups.tp is not None:
        ok &= _same_everywhere(comm, _views(_replicated(model, grads=False)), groups.tp)
    return ok


def _same_everywhere(comm: Communicator, views: list[torch.Tensor], group: Group) -> bool:
    local = torch.cat([v.reshape(-1) for v in views])
    high = torch.cat(_all_reduce_views(comm, views, group, "max"))
    low = torch.cat(_all_reduce_views(comm, views, group, "min"))
    return bool(torch.equal(high, local) and torch.equal(low, local))
