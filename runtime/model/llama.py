"""The Llama-style decoder: deterministic init, shared math, and the single-process reference
model, over the parameter catalogue of `runtime.model.catalogue`.

Every parameter has a name and a full shape, and is initialised from a generator seeded by
(seed, name) alone — so a stage of any plan can build exactly its own slice of the same
weights that the one-process model holds, without building the rest of the model.
The TP-sharded stage (`runtime.layered.stage`) and the reference use the same math functions
here; only the sharding and the collectives differ.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from planner.workload import ModelSpec
from runtime.model.catalogue import (EMBEDDING, HEAD, layer_param_shapes, model_tensors,  # noqa: F401 (re-exported)
                                     stored_name, unit_params)

INIT_STD = 0.02


def initial_value(spec: ModelSpec, name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A parameter's full initial value; a tied head starts as the embedding."""
    return init_param(stored_name(spec, name), shape, seed)


def init_param(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full initial value of one parameter; depends only on (seed, name, shape)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen) * INIT_STD


def shard(full: torch.Tensor, dim: int | None, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This TP rank's slice of a full tensor (contiguous block along `dim`)."""
    if dim is None or tp_size == 1:
        return full.clone()
    size = full.shape[dim] // tp_size
    return full.narrow(dim, tp_rank * size, size).clone()


# ---- math shared by the reference and the TP stages --------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # torch's fused op: one call where x·rsqrt(mean(x²) + ε)·w is five, each with its own
    # dispatch — a cost that, unlike the FLOPs, a TP rank does not share with its group
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [s, d] of every position, computed as transformers computes them (fp32
    inverse frequencies and angles, each frequency for both halves of the head dimension),
    so a Hugging Face model's q and k rotate by the very same numbers here."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(seq_len, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, s, heads, d]; rotate the pairs (i, i + d/2) of the head dimension (transformers'
    rotate_half layout, the one Llama, Mistral and Qwen2 checkpoints are stored in)."""
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # bf16 activations rotate by bf16 tables, as transformers
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def project_qkv(h: torch.Tensor, weights: Mapping[str, torch.Tensor], heads: int, kv_heads: int,
                head_dim: int) -> list[torch.Tensor]:
    """q [b, s, heads, d], k and v [b, s, kv_heads, d] from a layer's (local) weights by their
    names in the layer, with the q/k/v biases where the mapping holds them (Qwen2)."""
    b, s = h.shape[:2]
    return [F.linear(h, weights[f"attn.{x}.weight"], weights.get(f"attn.{x}.bias")).view(b, s, n, head_dim)
            for x, n in (("q", heads), ("k", kv_heads), ("v", kv_heads))]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q: [b, s, a, d], k/v: [b, s, k, d] (GQA: each kv head serves a/k query heads).

    GQA through sdpa's `enable_gqa`, not k and v copied a/k times: autograd keeps what the
    kernel reads, and the copies cost 2·(h − h_kv) more elements per token and layer — 7 % of
    a Llama-3-8B layer's activations on an H200 (docs/device-check.md)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2).flatten(2)


def mlp_activation(gate: torch.Tensor | None, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up if gate is not None else F.silu(up)


# ---- the single-process reference --------------------------------------------------------

class ReferenceLlama(nn.Module):
    """The whole model in one process, full (unsharded) weights; the equivalence baseline.
    A tied head is the embedding itself (one parameter, as transformers ties them)."""

    def __init__(self, spec: ModelSpec, seq_len: int, seed: int):
        super().__init__()
        self.spec = spec
        self.params = nn.ParameterDict()
        for name, shape in model_tensors(spec).items():
            self.params[name.replace(".", "/")] = nn.Parameter(init_param(name, shape, seed))
        cos, sin = rope_tables(seq_len, spec.head_dim, spec.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def p(self, name: str) -> torch.Tensor:
        return self.params[stored_name(self.spec, name).replace(".", "/")]

    def full_state(self) -> dict[str, torch.Tensor]:
        return {name.replace("/", "."): t.detach().clone() for name, t in self.params.items()}

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        spec, eps = self.spec, self.spec.norm_eps
        w = {name: self.p(f"layers.{i}.{name}") for name in layer_param_shapes(spec)}
        q, k, v = project_qkv(rms_norm(x, w["attn_norm.weight"], eps), w, spec.heads, spec.num_kv_heads,
                              spec.head_dim)
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        x = x + F.linear(causal_attention(q, k, v), w["attn.o.weight"])
        h = rms_norm(x, w["mlp_norm.weight"], eps)
        gate = F.linear(h, w["mlp.gate.weight"]) if spec.gated else None
        return x + F.linear(mlp_activation(gate, F.linear(h, w["mlp.up.weight"])), w["mlp.down.weight"])

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every token of the batch."""
        x = F.embedding(tokens, self.p(EMBEDDING))
        for i in range(self.spec.layers):
            x = self._layer(i, x)
        logits = F.linear(rms_norm(x, self.p("norm.weight"), self.spec.norm_eps), self.p(HEAD))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())  # fp32 loss for bf16 weights
