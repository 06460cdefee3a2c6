"""AdamW on one rank of a layered plan, in the precision and ZeRO stage the cost model prices
(docs/models-and-data.md §12, docs/checkpoints.md §11).

- fp32, zero_stage 0: every parameter is its own master copy; AdamW's two moments beside it
  (μ = 4 + 4 + 8): what `torch.optim.AdamW(foreach=False)` does, through the same function.
- bf16: the model's weights and gradients are bf16; the optimizer keeps an fp32 master copy
  and both moments (μ = 2 + 2 + 12), updates the master from the gradient read as fp32, and
  writes the master back into the bf16 weights. No loss scaling: bf16 has fp32's exponents.
- ZeRO-1 (D ≥ 2 pipelines): per bucket (`runtime.layered.zero`) this rank keeps the master
  and moments of its block only. `reduce_scatter` sums the bucket's gradient over its D
  owners, each getting its block; `step` updates the block and all-gathers the weights, so
  every owner again holds the whole chunk (in fp32 the block's weights are read from the
  parameters: they are the master). Norm weights go with chunk 0, whose owner is the stage's
  TP leader; it broadcasts them to its TP group after the gather.

Every update is `torch.optim.adamw.adamw` on fp32 tensors (betas 0.9, 0.999, eps 1e-8,
single-tensor): element-wise, so updating a block gives the very bits the whole tensor's
update would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.optim.adamw import adamw

from runtime.communication.communicator import Communicator
from runtime.config import RunConfig
from runtime.layered.groups import RankGroups
from runtime.layered.stage import StageModel
from runtime.metrics.timing import STEP, SYNC, PhaseTimer
from runtime.layered.zero import Bucket, Piece, block_size, local_region, rank_buckets, share_regions, zero_active
from runtime.model.catalogue import stored_name

BETAS, EPS = (0.9, 0.999), 1e-8
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Slot:
    """What one AdamW update covers: a whole parameter (`param`) or this rank's block of a
    bucket (`bucket`, flat range [lo, hi)); its fp32 master (None: the weights themselves are
    fp32 and serve as master), moments and step count."""

    m: torch.Tensor
    v: torch.Tensor
    master: torch.Tensor | None = None
    param: torch.nn.Parameter | None = None
    bucket: Bucket | None = None
    lo: int = 0
    hi: int = 0
    step: torch.Tensor = field(default_factory=lambda: torch.tensor(0.0))
    grad: torch.Tensor | None = None  # a block's summed gradient, set by reduce_scatter


def piece_view(model: StageModel, tp_rank: int, piece: Piece, grads: bool) -> torch.Tensor:
    """The local view (of the parameter, or of its gradient) that `piece` names."""
    param = model.p(piece.name)
    tensor = param.grad if grads else param.data
    if piece.dim is None:
        return tensor
    shape = model.full_shape(piece.name)
    start = local_region(shape, piece.dim, tp_rank, model.tp_size)[0][piece.dim]
    return tensor.narrow(piece.dim, piece.offsets[piece.dim] - start, piece.sizes[piece.dim])


class StageOptimizer:
    """AdamW over a stage's parameters under `config.precision` and `config.zero_stage`.
    Made once the weights are final in fp32 (fresh, read from a model folder or from a
    checkpoint); `cast_model` then turns the model's weights to the run's precision."""

    def __init__(self, model: StageModel, groups: RankGroups, config: RunConfig):
        self.model, self.groups, self.config = model, groups, config
        self.dtype = DTYPES[config.precision]
        self.zero = zero_active(groups.layout, config.zero_stage)
        self.slots = self._share_slots() if self.zero else self._param_slots()
        self._by_param = {id(slot.param): slot for slot in self.slots if slot.param is not None}
        self._flat: dict[tuple, torch.Tensor] = {}  # kept padded gradient buffers, by bucket

    def _master(self, weights: torch.Tensor) -> torch.Tensor | None:
        return weights.detach().float().clone() if self.dtype != torch.float32 else None

    def _param_slots(self) -> list[Slot]:
        return [Slot(m=torch.zeros_like(p, dtype=torch.float32), v=torch.zeros_like(p, dtype=torch.float32),
                     master=self._master(p), param=p) for p in self.model.parameters()]

    def _share_slots(self) -> list[Slot]:
        slots = []
        for bucket in rank_buckets(self.groups.layout, self.model.spec, self.groups.rank):
            lo, hi = bucket.owned_span(self.groups.rank)
            weights = self.pack(bucket, grads=False)[lo:hi]
            slots.append(Slot(m=torch.zeros(hi - lo, device=weights.device),
                              v=torch.zeros(hi - lo, device=weights.device),
                              master=self._master(weights), bucket=bucket, lo=lo, hi=hi))
        return slots

    def slot_of(self, param: torch.nn.Parameter) -> Slot:
        """The slot of a whole parameter (zero_stage 0)."""
        return self._by_param[id(param)]

    def cast_model(self) -> None:
        """The model's weights in the run's precision (bf16: rounded from the fp32 master)."""
        if self.dtype != torch.float32:
            self.model.to(self.dtype)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every gradient dropped (the next backward makes new ones), as torch's optimizers do."""
        for param in self.model.parameters():
            param.grad = None

    # -- ZeRO-1 ------------------------------------------------------------------------------
    def pack(self, bucket: Bucket, grads: bool, out: torch.Tensor | None = None) -> torch.Tensor:
        """The bucket's pieces (gradients or weights) one after another, into `out` if given."""
        views = [piece_view(self.model, self.groups.tp_rank, p, grads) for p in bucket.pieces]
        if out is None:
            return torch.cat([v.reshape(-1) for v in views])
        offset = 0
        for view in views:
            out[offset:offset + view.numel()].view(view.shape).copy_(view)
            offset += view.numel()
        return out

    def unpack(self, bucket: Bucket, flat: torch.Tensor) -> None:
        """The inverse of `pack` for weights: every piece's view takes its part of `flat`."""
        offset = 0
        for piece in bucket.pieces:
            view = piece_view(self.model, self.groups.tp_rank, piece, grads=False)
            view.copy_(flat[offset:offset + view.numel()].view(view.shape))
            offset += view.numel()

    def _padded(self, bucket: Bucket) -> torch.Tensor:
        """A kept zero-padded buffer of D blocks of ⌈n/D⌉ for the bucket's gradient."""
        owners = len(bucket.ranks)
        size = owners * block_size(bucket.numel, owners)
        kept = self._flat.get((bucket.ranks, bucket.presummed))
        if kept is None or kept.dtype != self.dtype:
            kept = self._flat[(bucket.ranks, bucket.presummed)] = torch.zeros(size, dtype=self.dtype,
                                                                               device=self.model.device)
        return kept

    def reduce_scatter(self, comm: Communicator) -> None:
        """Each block's gradient summed over its bucket's D owners (the tied copies' buckets
        are sums already: this rank just takes its block), in the one global bucket order."""
        for slot in self.slots:
            bucket, owners = slot.bucket, len(slot.bucket.ranks)
            flat = self.pack(bucket, grads=True, out=self._padded(bucket))
            block = block_size(bucket.numel, owners)
            index = bucket.ranks.index(self.groups.rank)
            mine = (flat.narrow(0, index * block, block) if bucket.presummed
                    else comm.reduce_scatter(flat, self.groups.dp[bucket.ranks]))
            slot.grad = mine[:slot.hi - slot.lo].float()

    def _gather(self, comm: Communicator, slot: Slot, weights: torch.Tensor) -> None:
        """Every owner's updated block of the bucket, back into every owner's weights."""
        owners = len(slot.bucket.ranks)
        block = torch.zeros(block_size(slot.bucket.numel, owners), dtype=self.dtype, device=weights.device)
        block[:slot.hi - slot.lo] = weights
        flat = torch.cat(comm.all_gather(block, self.groups.dp[slot.bucket.ranks]))
        self.unpack(slot.bucket, flat[:slot.bucket.numel])

    # -- the update --------------------------------------------------------------------------
    def _update(self, weights: torch.Tensor, grad: torch.Tensor, slot: Slot) -> None:
        adamw([weights], [grad], [slot.m], [slot.v], [], [slot.step], foreach=False, capturable=False,
              differentiable=False, fused=None, grad_scale=None, found_inf=None, has_complex=False,
              amsgrad=False, beta1=BETAS[0], beta2=BETAS[1], lr=self.config.lr,
              weight_decay=self.config.weight_decay, eps=EPS, maximize=False)

    @torch.no_grad()
    def step(self, comm: Communicator, timer: PhaseTimer | None = None) -> None:
        """One AdamW step on every slot; with ZeRO-1 the updated blocks are then gathered and
        the TP leader's norm weights broadcast — timed in `timer`'s step and sync phases, as
        the rest of §11's τ_dp (the reduce-scatter) is."""
        updated = []
        for slot in self.slots:
            if slot.bucket is None:
                weights = slot.param if slot.master is None else slot.master
                self._update(weights, slot.param.grad.float() if slot.master is not None else slot.param.grad, slot)
                if slot.master is not None:
                    slot.param.copy_(slot.master)
                continue
            weights = slot.master if slot.master is not None else self.pack(slot.bucket, grads=False)[slot.lo:slot.hi]
            self._update(weights, slot.grad, slot)
            slot.grad = None
            updated.append((slot, weights))
        if not self.zero:
            return
        timer = timer or PhaseTimer()
        with timer.phase(STEP), timer.phase(SYNC):
            for slot, weights in updated:
                self._gather(comm, slot, weights)
            if self.groups.tp is not None:
                self._broadcast_replicated(comm)

    def _broadcast_replicated(self, comm: Communicator) -> None:
        """ZeRO-1: the TP leader updated the norm weights (chunk 0's owner); its group takes them."""
        replicated = self.model.replicated()
        flat = comm.broadcast(torch.cat([p.reshape(-1) for p in replicated]), self.groups.stage.leader,
                              self.groups.tp)
        offset = 0
        for param in replicated:
            param.copy_(flat[offset:offset + param.numel()].view_as(param))
            offset += param.numel()

    def counted_grads(self) -> list[torch.Tensor]:
        """ZeRO-1: the summed gradient elements this rank counts in the global norm — its
        blocks, less a tied head's (a copy of the embedding's): every element once in all."""
        spec, counted = self.model.spec, []
        for region in share_regions(self.groups.layout, spec, self.groups.rank):
            if stored_name(spec, region.name) == region.name:
                count = 1
                for size in region.sizes:
                    count *= size
                counted.append(self.slots[region.bucket].grad[region.at:region.at + count])
        return counted

    def held_grads(self) -> list[torch.Tensor]:
        """ZeRO-1: the summed gradients this rank updates with (its blocks)."""
        return [slot.grad for slot in self.slots]

    # -- what it holds -----------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes of optimizer state: fp32 masters (bf16) and both moments."""
        return sum(t.numel() * t.element_size() for s in self.slots
                   for t in (s.m, s.v, s.master) if t is not None)

    def held_bytes(self) -> dict[str, int]:
        """Per kind, the bytes this rank holds of its stage's training state, counted from the
        tensors: weights, gradients (as `.grad`), optimizer state."""
        params = list(self.model.parameters())
        return {"weights": sum(p.numel() * p.element_size() for p in params),
                "gradients": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
                "optimizer": self.state_bytes()}
