"""The check both kinds' workers make on each step's loss (runtime/layered/worker.py,
runtime/sequence/worker.py)."""

from __future__ import annotations

import math

import torch

from runtime.communication.communicator import Communicator
from runtime.errors import RunError


def check_loss(comm: Communicator, step: int, loss: float, own_loss: float) -> None:
    """A loss that is not finite stops the run at this step on every rank alike (each holds
    the summed loss), before the step's checkpoint or --save-hf: weights trained on it are no
    model. The error names the ranks whose own share of the loss was not finite."""
    if math.isfinite(loss):
        return
    flags = torch.zeros(comm.world_size, dtype=torch.float64)
    flags[comm.rank] = 0.0 if math.isfinite(own_loss) else 1.0
    ranks = comm.all_reduce(flags.to(comm.device), comm.world).cpu().nonzero().flatten().tolist()
    where = f" (computed on rank {', '.join(map(str, ranks))})" if ranks else ""
    raise RunError(f"step {step + 1}: the loss is {loss}{where}: the run stops; nothing of this step is saved")
