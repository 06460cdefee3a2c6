"""Gradient clipping by the global norm (docs/models-and-data.md §12, `--clip-grad`): what
`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` does in one process, for a
model spread over ranks.

The norm is the whole model's: each rank sums the squares of the gradient elements it
*counts* — a partition of the model's elements over the ranks, which each kind's runtime
draws (`runtime.layered.clipping`, `runtime.sequence.clipping`): a TP shard counts its own
elements, a tensor replicated in a TP group (a norm's weight) only on one rank of the
group, a data-parallel replica not at all (after the gradient sync it holds the same
gradient as the first), a tied matrix's second copy not at all — and one all-reduce over the
world, through the communicator, gives every rank the same total. Every rank then scales
every gradient it holds (copies and replicas included) by the same coefficient, so replicas
stay bit-identical.

The sums are taken in float64: the total differs from torch's float32 norm of per-tensor
norms in the last bits only.
"""

from __future__ import annotations

import torch

from runtime.communication.communicator import Communicator

TORCH_CLIP_EPS = 1e-6  # clip_grad_norm_'s coefficient is max_norm / (total_norm + 1e-6)


def squared_sum(grads: list[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """Σ g² over every element of `grads` (None: no gradient), a float64 scalar tensor."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for grad in grads:
        if grad is not None:
            total += grad.detach().double().pow(2).sum()
    return total


def clip_coefficient(max_norm: float, total_norm: float) -> float:
    """The factor clip_grad_norm_ multiplies every gradient by (1: left alone)."""
    return min(1.0, max_norm / (total_norm + TORCH_CLIP_EPS))


def clip_global_norm(comm: Communicator, counted: list[torch.Tensor | None], held: list[torch.Tensor | None],
                     max_norm: float) -> float:
    """Scale `held` (every gradient this rank holds) so that the model's gradient norm is at
    most `max_norm`; `counted`: this rank's part of the partition. Returns the norm before
    clipping, the same on every rank. Every rank must call it (one all-reduce over the world)."""
    local = squared_sum(counted, comm.device).reshape(1)
    total_norm = float(comm.all_reduce(local, comm.world).item()) ** 0.5
    coefficient = clip_coefficient(max_norm, total_norm)
    if coefficient < 1.0:
        for grad in held:
            if grad is not None:
                grad.mul_(coefficient)
    return total_norm
