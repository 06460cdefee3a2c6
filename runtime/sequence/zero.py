"""ZeRO-3 inside a replica: every unit's parameters, gradients and AdamW moments are sharded
over the replica's ranks (`runtime.sequence.shards`); a unit's weights are all-gathered just
before use and its gradients reduce-scattered back onto the shards.

*Own code, not torch FSDP2 (`fully_shard`).* FSDP2 does run on CPU/gloo here (checked with
torch 2.13: two processes, `fully_shard` per layer on a `DeviceMesh("cpu")`), but:
- the communicator must own every collective of the runtime (`runtime.communication.communicator`): FSDP2 issues
  its all-gathers and reduce-scatters itself, on the process groups of a DeviceMesh, from
  DTensor hooks the communicator never sees — and issue 13 routes a replica that spans
  NVIDIA and AMD devices through a bridge (hierarchical collectives inside `Communicator`),
  which FSDP2's own process groups cannot take;
- replicas of a sequence plan have different sizes N_r, so their shards do not line up: FSDP2's
  replicated sharding (HSDP) needs a 2-D mesh of equal replicas, while the cross-replica sync
  here works on segments between every replica's block boundaries (`runtime.sequence.sync`).
The explicit version is small:
- `gather(unit)`: one all-gather of the unit's blocks (an autograd function whose backward is
  the reduce-scatter of the unit's gradient, summed over the replica's members);
- `regathering(unit, flat)`: without recompute, the gathered weights are not kept for the
  backward pass: every tensor autograd saves that lives in the gathered buffer is packed as
  (unit, size, stride, offset) and re-gathered on first use in backward (one all-gather per
  unit), then dropped when the unit's gradient has been reduce-scattered;
- with recompute, `torch.utils.checkpoint` re-runs the layer — gather included — in backward.
So a layer's weights are gathered in the forward pass and again in the backward pass (with
recompute: by the recomputed forward), and never held beyond one layer.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from runtime.communication.communicator import Communicator, Group
from runtime.model.llama import init_param
from runtime.sequence.shards import UnitCatalogue, block_size, block_span


class _GatherUnit(torch.autograd.Function):
    """Forward: the unit's flat vector from every rank's block; backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, block, states: ZeroStates, unit: int):
        ctx.states, ctx.unit = states, unit
        return states.all_gather(block)

    @staticmethod
    def backward(ctx, grad):
        states, unit = ctx.states, ctx.unit
        states.regathered.pop(unit, None)  # the unit's backward is done: drop its weights
        return states.comm.reduce_scatter(grad.contiguous(), states.group), None, None


class ZeroStates(nn.Module):
    """This rank's block of every unit (one flat parameter each) and the gather/scatter of
    the replica; `group` None: a replica of one rank, which holds every unit whole."""

    def __init__(self, catalogues: list[UnitCatalogue], *, seed: int, comm: Communicator | None,
                 group: Group | None, index: int):
        super().__init__()
        self.catalogues, self.comm, self.group, self.index = catalogues, comm, group, index
        self.parts = group.size if group is not None else 1
        self.blocks = nn.ParameterList(self._init_block(c, seed) for c in catalogues)
        self.regathered: dict[int, torch.Tensor] = {}

    def _init_block(self, catalogue: UnitCatalogue, seed: int) -> nn.Parameter:
        """This rank's block of the unit's vector, cut from the one-process model's init."""
        flat = torch.cat([init_param(name, shape, seed).flatten() for name, (shape, _) in catalogue.params.items()])
        start, stop = block_span(catalogue.size, self.parts, self.index)
        block = torch.zeros(block_size(catalogue.size, self.parts))
        block[:stop - start] = flat[start:stop]
        return nn.Parameter(block)

    def span(self, unit: int) -> tuple[int, int]:
        """The real elements of the unit's vector this rank's block holds."""
        return block_span(self.catalogues[unit].size, self.parts, self.index)

    def all_gather(self, block: torch.Tensor) -> torch.Tensor:
        """The unit's whole vector, padding included: every rank's block, in rank order."""
        return torch.cat(self.comm.all_gather(block.detach(), self.group))

    def gather(self, unit: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The unit's full weights by name (differentiable into the block) and their buffer.
        The weights are one split of the buffer, not a slice each: the split's backward
        writes every weight's gradient into one buffer-sized gradient, where each slice's
        backward would fill a buffer-sized zero tensor of its own and add it up (9 passes
        over the layer's vector per backward, 10 % of a step at the bench's shapes)."""
        block, catalogue = self.blocks[unit], self.catalogues[unit]
        flat = block if self.group is None else _GatherUnit.apply(block, self, unit)
        shapes = [shape for shape, _ in catalogue.params.values()]
        pieces = flat.split([*(stop - start for _, (start, stop) in catalogue.params.values()),
                             flat.numel() - catalogue.size])  # the last piece: the padding
        return {name: piece.view(shape) for name, piece, shape in zip(catalogue.params, pieces, shapes)}, flat

    @contextlib.contextmanager
    def regathering(self, *held: tuple[int, torch.Tensor]):
        """For each (unit, gathered buffer `flat`) held: autograd keeps no tensor of `flat`,
        only where it was, and gathers the unit again on first use in backward. A no-op for
        a one-rank replica."""
        if self.group is None:
            yield
            return
        units = {flat.untyped_storage().data_ptr(): unit for unit, flat in held}

        def pack(tensor: torch.Tensor):
            unit = units.get(tensor.untyped_storage().data_ptr())
            if unit is None:
                return tensor
            return (unit, tensor.size(), tensor.stride(), tensor.storage_offset())

        def unpack(packed):
            if isinstance(packed, torch.Tensor):
                return packed
            unit, size, stride, offset = packed
            if unit not in self.regathered:
                with torch.no_grad():
                    self.regathered[unit] = self.all_gather(self.blocks[unit])
            return self.regathered[unit].as_strided(size, stride, offset)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def rank_pieces(self) -> dict[str, tuple[int, torch.Tensor]]:
        """name → (offset in the flattened parameter, this rank's elements of it)."""
        out = {}
        for unit, catalogue in enumerate(self.catalogues):
            start, stop = self.span(unit)
            block = self.blocks[unit].detach()
            for name, (_, (lo, hi)) in catalogue.params.items():
                a, b = max(lo, start), min(hi, stop)
                if a < b:
                    out[name] = (a - lo, block[a - start:b - start].clone())
        return out
