"""Which gradients a layered plan's rank counts in the global norm of `--clip-grad`
(`runtime.clipping`): each element of the model exactly once over all ranks.

- Only pipeline 0 counts: after the data-parallel sync every pipeline holds the summed
  gradient of every parameter (pipelines that split the layers differently included), and
  pipeline 0 holds every unit once.
- A TP shard (a slice of a matrix, a q/k/v bias or a vocabulary block) counts its elements
  on its own rank; a tensor replicated in the TP group (a norm's weight, whose gradient is
  the same on every rank of the group) counts on TP rank 0 only.
- Tied embeddings: the head on a last stage is a copy of the embedding, its gradient summed
  with it (`runtime.layered.grad_sync.sync_tied`); the first stage's embedding counts, the
  copy does not (transformers has one parameter there).
"""

from __future__ import annotations

import torch

from runtime.clipping import clip_global_norm
from runtime.communication.communicator import Communicator
from runtime.layered.groups import RankGroups
from runtime.layered.optimizer import StageOptimizer
from runtime.layered.stage import StageModel
from runtime.model.llama import stored_name


def counted_grads(model: StageModel, groups: RankGroups) -> list[torch.Tensor | None]:
    """This rank's part of the model's gradient elements (see the module's docstring)."""
    if groups.stage.pipeline != 0:
        return []
    counted = []
    for unit in groups.stage.units(model.spec.layers):
        for name, param, dim in model.unit_shards(unit):
            copy = stored_name(model.spec, name) != name  # a tied head: the embedding's copy
            if not copy and (dim is not None or groups.tp_rank == 0):
                counted.append(param.grad)
    return counted


def clip_gradients(comm: Communicator, model: StageModel, groups: RankGroups, max_norm: float | None,
                   optimizer: StageOptimizer | None = None) -> float | None:
    """After the gradient sync, before the optimizer step: clip to `max_norm` (None: no
    clipping, nothing exchanged); returns the norm before clipping. Under ZeRO-1 the summed
    gradients are the owners' blocks (`StageOptimizer.counted_grads`: each element once)."""
    if max_norm is None:
        return None
    if optimizer is not None and optimizer.zero:
        return clip_global_norm(comm, optimizer.counted_grads(), optimizer.held_grads(), max_norm)
    held = [param.grad for param in model.parameters()]
    return clip_global_norm(comm, counted_grads(model, groups), held, max_norm)
