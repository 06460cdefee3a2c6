"""One pipeline stage of the Llama model, sharded over its TP group.

A stage is built from the plan's layer range only: it creates (its slice of) the
parameters of the units it holds — embedding on a first stage, layers [start, end), final
norm and LM head on a last stage — each sliced from the same full deterministic init as the
reference, so every plan starts from the reference's weights.

With `sequence_parallel` and t > 1 (docs/cost-model.md §3.5) the stage's hidden states,
between its matrix products, are this rank's 1/t of the sequence: the norms and residual
adds run on it, recompute keeps it as the layer input, and each TP all-reduce is a
reduce-scatter plus an all-gather (`runtime.model.tp`). The weights may be bf16 (the
optimizer's `cast_model`); the logits are then read in fp32 for the loss, as §3.5 prices them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.workload import ModelSpec
from runtime.config import check_model_fits
from runtime.communication.communicator import Communicator, Group
from runtime.layered.layout import StageRanks
from runtime.model.llama import (apply_rope, causal_attention, initial_value, layer_param_shapes, mlp_activation,
                                 project_qkv, rms_norm, rope_tables, shard, unit_params)
from runtime.model.tp import (copy_to_tp, gather_sequence, reduce_from_tp, scatter_sequence,
                              vocab_parallel_cross_entropy, vocab_parallel_embedding)


class StageModel(nn.Module):
    """`tp_group` None: TP size 1, no communicator needed; otherwise every TP collective goes
    through `comm` on `tp_group`."""

    def __init__(self, spec: ModelSpec, stage: StageRanks, tp_rank: int, tp_group: Group | None,
                 seq_len: int, seed: int, recompute: bool = False, comm: Communicator | None = None,
                 sequence_parallel: bool = False):
        super().__init__()
        check_model_fits(spec, [stage.tp])
        self.spec, self.stage, self.tp_group, self.recompute = spec, stage, tp_group, recompute
        self.comm = comm
        self.tp_size, self.tp_rank = stage.tp, tp_rank
        self.sequence_parallel = sequence_parallel and stage.tp > 1  # a group of one has nothing to split
        self.split_boundaries = sequence_parallel  # the run's: boundaries exchanged in split form
        self.params = nn.ParameterDict()
        self.shard_dims: dict[str, int | None] = {}
        self.full_shapes: dict[str, tuple[int, ...]] = {}
        for unit in stage.units(spec.layers):
            for name, (shape, dim) in unit_params(spec, unit).items():
                full = initial_value(spec, name, shape, seed)  # a tied head: the embedding's
                self.params[name.replace(".", "/")] = nn.Parameter(shard(full, dim, tp_rank, stage.tp))
                self.shard_dims[name] = dim
                self.full_shapes[name] = shape
        cos, sin = rope_tables(seq_len, spec.head_dim, spec.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.vocab_start = tp_rank * (spec.vocab // stage.tp)

    def p(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "/")]

    def full_shape(self, name: str) -> tuple[int, ...]:
        """The unsharded shape of parameter `name`."""
        return self.full_shapes[name]

    @property
    def device(self) -> torch.device:
        return self.cos.device

    @property
    def dtype(self) -> torch.dtype:
        """The weights' (and so the activations') dtype."""
        return next(iter(self.params.values())).dtype

    def replicated(self) -> list[torch.nn.Parameter]:
        """The parameters every rank of the TP group holds whole (norm weights), in unit order."""
        return [p for u in self.stage.units(self.spec.layers) for _, p, dim in self.unit_shards(u) if dim is None]

    def seq_len_held(self, seq_len: int) -> int:
        """Tokens of a sequence whose hidden states this rank holds between layers."""
        return seq_len // self.tp_size if self.sequence_parallel else seq_len

    def _enter_tp(self, x: torch.Tensor) -> torch.Tensor:
        """Before column-parallel linears: the whole (gathered) sequence, on every TP rank."""
        if self.sequence_parallel:
            return gather_sequence(x, self.comm, self.tp_group)
        return copy_to_tp(x, self.comm, self.tp_group)

    def _leave_tp(self, x: torch.Tensor) -> torch.Tensor:
        """After row-parallel linears: the sum of the group's partial sums (this rank's tokens)."""
        if self.sequence_parallel:
            return scatter_sequence(x, self.comm, self.tp_group)
        return reduce_from_tp(x, self.comm, self.tp_group)

    def unit_shards(self, unit: int) -> list[tuple[str, torch.Tensor, int | None]]:
        """(full name, local parameter, shard dim) of one held unit, in catalogue order."""
        return [(name, self.p(name), dim) for name, (_, dim) in unit_params(self.spec, unit).items()]

    def _attention(self, i: int, x: torch.Tensor) -> torch.Tensor:
        spec, t = self.spec, self.tp_size
        w = {name: self.p(f"layers.{i}.{name}") for name in layer_param_shapes(spec)}
        h = self._enter_tp(rms_norm(x, w["attn_norm.weight"], spec.norm_eps))
        q, k, v = project_qkv(h, w, spec.heads // t, spec.num_kv_heads // t, spec.head_dim)
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        return self._leave_tp(F.linear(causal_attention(q, k, v), w["attn.o.weight"]))

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p = lambda n: self.p(f"layers.{i}.{n}")  # noqa: E731
        h = self._enter_tp(rms_norm(x, p("mlp_norm.weight"), self.spec.norm_eps))
        gate = F.linear(h, p("mlp.gate.weight")) if self.spec.gated else None
        hidden = mlp_activation(gate, F.linear(h, p("mlp.up.weight")))
        return self._leave_tp(F.linear(hidden, p("mlp.down.weight")))

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(i, x)
        return x + self._mlp(i, x)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None, loss_scale: float) -> torch.Tensor:
        """First stage: inputs are token ids; others: the previous stage's hidden states.
        Last stage returns Σ token losses · loss_scale; others return hidden states."""
        x = (vocab_parallel_embedding(inputs, self.p("embed.weight"), self.vocab_start, self.comm, self.tp_group,
                                      self.sequence_parallel) if self.stage.first else inputs)
        for i in range(self.stage.layer_start, self.stage.layer_end):
            # Recompute: keep only each layer's input, rebuild its activations in backward
            # (TP collectives included, in the same order on every rank of the group).
            x = checkpoint(self._layer, i, x, use_reentrant=False) if self.recompute else self._layer(i, x)
        if not self.stage.last:
            return x
        h = self._enter_tp(rms_norm(x, self.p("norm.weight"), self.spec.norm_eps))
        logits = F.linear(h, self.p("head.weight")).float()  # the loss in fp32 whatever the weights' dtype
        losses = vocab_parallel_cross_entropy(logits, labels, self.vocab_start, self.comm, self.tp_group)
        return losses.sum() * loss_scale
