"""Which gradients a sequence plan's rank counts in the global norm of `--clip-grad`
(`runtime.clipping`): each element of the model exactly once over all ranks.

Inside a replica ZeRO-3 partitions every unit's flat vector into blocks, one per member
(`runtime.sequence.shards`; the padding at a unit's end has a zero gradient), and a tied
head has no block of its own (it uses the embedding's unit), so replica 0's members'
blocks hold every element once. The other replicas count nothing: after the cross-replica
sync (`runtime.sequence.sync`) their blocks hold the same summed gradient, cut differently.
"""

from __future__ import annotations

from runtime.clipping import clip_global_norm
from runtime.communication.communicator import Communicator
from runtime.sequence.zero import ZeroStates


def clip_gradients(comm: Communicator, states: ZeroStates, replica: int, max_norm: float | None) -> float | None:
    """After the gradient sync, before the optimizer step: clip to `max_norm` (None: no
    clipping, nothing exchanged); returns the norm before clipping."""
    if max_norm is None:
        return None
    held = [block.grad for block in states.blocks]
    return clip_global_norm(comm, held if replica == 0 else [], held, max_norm)
