"""One member's share of the Llama model under a sequence plan: the same math as the
one-process reference (`runtime.model.llama`) on this member's tokens only.

A member holds t_i tokens of its group's shard outside attention; it embeds them, runs every
layer on them (weights gathered by ZeRO-3, `runtime.sequence.zero`), and computes the LM
head and the loss of its own tokens. Rotary embeddings use the tokens' true sequence
positions (the mirrored layout of docs/sequence-plans.md §7.1). Attention is the one place members meet
(`attention(q, k, v)`: Ulysses inside the group, the ring between groups): it returns this
member's rows of full causal attention.

The loss is Σ token losses · 1/(B·s) on every member, so the gradients summed over members
(reduce-scatter) and replicas (the sync) are those of the mean over all B·s tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.workload import ModelSpec
from runtime.model.llama import EMBEDDING, HEAD, apply_rope, mlp_activation, project_qkv, rms_norm, rope_tables
from runtime.sequence.zero import ZeroStates

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class MemberModel(nn.Module):
    """`attention(q, k, v)`: q [b, t_i, a, d], k/v [b, t_i, k, d] (rotary applied) → [b, t_i, a·d]."""

    def __init__(self, spec: ModelSpec, states: ZeroStates, attention: Attention, *,
                 positions: np.ndarray | torch.Tensor, seq_len: int, recompute: bool):
        super().__init__()
        self.spec, self.states, self.attention, self.recompute = spec, states, attention, recompute
        cos, sin = rope_tables(seq_len, spec.head_dim, spec.rope_theta)
        index = torch.as_tensor(positions, dtype=torch.int64)
        self.register_buffer("cos", cos[index], persistent=False)
        self.register_buffer("sin", sin[index], persistent=False)

    def _attention(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        h = rms_norm(x, w["attn_norm.weight"], spec.norm_eps)
        q, k, v = project_qkv(h, w, spec.heads, spec.num_kv_heads, spec.head_dim)
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        return F.linear(self.attention(q, k, v), w["attn.o.weight"])

    def _mlp(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, w["mlp_norm.weight"], self.spec.norm_eps)
        gate = F.linear(h, w["mlp.gate.weight"]) if self.spec.gated else None
        return F.linear(mlp_activation(gate, F.linear(h, w["mlp.up.weight"])), w["mlp.down.weight"])

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        weights, flat = self.states.gather(i + 1)
        prefix = f"layers.{i}."
        w = {name[len(prefix):]: tensor for name, tensor in weights.items()}
        # Under recompute, checkpoint already drops every saved tensor (and gathers again in
        # its recomputed forward); otherwise the gathered weights are re-gathered in backward.
        with contextlib.nullcontext() if self.recompute else self.states.regathering((i + 1, flat)):
            x = x + self._attention(w, x)
            return x + self._mlp(w, x)

    def _head_loss(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head, summed token losses. A tied head is the embedding's unit,
        gathered again: its gradient reaches the embedding's block through a second
        reduce-scatter (one copy, unlike a layered plan's two)."""
        unit = self.spec.layers + 1
        w, flat = self.states.gather(unit)
        held = [(unit, flat)]
        if self.spec.tied_embeddings:
            embedding, embedding_flat = self.states.gather(0)
            w, held = {**w, HEAD: embedding[EMBEDDING]}, held + [(0, embedding_flat)]
        with self.states.regathering(*held):
            logits = F.linear(rms_norm(x, w["norm.weight"], self.spec.norm_eps), w[HEAD])
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor, loss_scale: float) -> torch.Tensor:
        """tokens, labels: [b, t_i] at this member's positions; returns Σ token losses · loss_scale."""
        weights, _ = self.states.gather(0)  # the embedding's backward keeps no weight
        x = F.embedding(tokens, weights["embed.weight"])
        for i in range(self.spec.layers):
            x = checkpoint(self._layer, i, x, use_reentrant=False) if self.recompute else self._layer(i, x)
        return self._head_loss(x, labels) * loss_scale
