"""The Llama-style decoder: parameter catalogue, deterministic init, shared math, and the
single-process reference model.

Every parameter has a name and a full shape, and is initialised from a generator seeded by
(seed, name) alone — so a stage of any plan can build exactly its own slice of the same
weights that the one-process model holds, without building the rest of the model.
The TP-sharded stage (`runtime.layered.stage`) and the reference use the same math functions
here; only the sharding and the collectives differ.
"""

from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import nn

from planner.workload import ModelSpec

NORM_EPS = 1e-5
ROPE_THETA = 10000.0
INIT_STD = 0.02

# How each parameter is split across a TP group: dim 0 = column-parallel (output rows) or
# vocab-parallel; dim 1 = row-parallel (input columns); None = replicated (norms).
LAYER_SHARD_DIMS = {
    "attn_norm.weight": None, "attn.q.weight": 0, "attn.k.weight": 0, "attn.v.weight": 0,
    "attn.o.weight": 1, "mlp_norm.weight": None, "mlp.gate.weight": 0, "mlp.up.weight": 0,
    "mlp.down.weight": 1,
}
EMB_SHARD_DIMS = {"embed.weight": 0}
HEAD_SHARD_DIMS = {"norm.weight": None, "head.weight": 0}


def layer_param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Full shapes of one transformer layer's parameters (names relative to the layer)."""
    h, d, f = spec.hidden, spec.head_dim, spec.ffn_hidden
    shapes = {
        "attn_norm.weight": (h,), "attn.q.weight": (spec.heads * d, h),
        "attn.k.weight": (spec.num_kv_heads * d, h), "attn.v.weight": (spec.num_kv_heads * d, h),
        "attn.o.weight": (h, spec.heads * d), "mlp_norm.weight": (h,),
        "mlp.up.weight": (f, h), "mlp.down.weight": (h, f),
    }
    if spec.gated:
        shapes["mlp.gate.weight"] = (f, h)
    return shapes


def unit_params(spec: ModelSpec, unit: int) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Full names → (full shape, shard dim) of a sync unit (0 = emb, i+1 = layer i, L+1 = head)."""
    if unit == 0:
        return {"embed.weight": ((spec.vocab, spec.hidden), 0)}
    if unit == spec.layers + 1:
        return {"norm.weight": ((spec.hidden,), None), "head.weight": ((spec.vocab, spec.hidden), 0)}
    return {f"layers.{unit - 1}.{name}": (shape, LAYER_SHARD_DIMS[name])
            for name, shape in layer_param_shapes(spec).items()}


def init_param(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full initial value of one parameter; depends only on (seed, name, shape)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen) * INIT_STD


def shard(full: torch.Tensor, dim: int | None, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This TP rank's slice of a full tensor (contiguous block along `dim`)."""
    if dim is None or tp_size == 1:
        return full.clone()
    size = full.shape[dim] // tp_size
    return full.narrow(dim, tp_rank * size, size).clone()


# ---- math shared by the reference and the TP stages --------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # torch's fused op: one call where x·rsqrt(mean(x²) + ε)·w is five, each with its own
    # dispatch — a cost that, unlike the FLOPs, a TP rank does not share with its group
    return F.rms_norm(x, (x.shape[-1],), weight, NORM_EPS)


def rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, s, heads, d]; rotate pairs (even, odd) of the head dimension."""
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q: [b, s, a, d], k/v: [b, s, k, d] (GQA: each kv head serves a/k query heads)."""
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True)
    return out.transpose(1, 2).flatten(2)


def mlp_activation(gate: torch.Tensor | None, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up if gate is not None else F.silu(up)


# ---- the single-process reference --------------------------------------------------------

class ReferenceLlama(nn.Module):
    """The whole model in one process, full (unsharded) weights; the equivalence baseline."""

    def __init__(self, spec: ModelSpec, seq_len: int, seed: int):
        super().__init__()
        self.spec = spec
        self.params = nn.ParameterDict()
        for unit in range(spec.layers + 2):
            for name, (shape, _) in unit_params(spec, unit).items():
                self.params[name.replace(".", "/")] = nn.Parameter(init_param(name, shape, seed))
        cos, sin = rope_tables(seq_len, spec.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def p(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "/")]

    def full_state(self) -> dict[str, torch.Tensor]:
        return {name.replace("/", "."): t.detach().clone() for name, t in self.params.items()}

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p, spec = (lambda n: self.p(f"layers.{i}.{n}")), self.spec
        b, s, _ = x.shape
        h = rms_norm(x, p("attn_norm.weight"))
        q = F.linear(h, p("attn.q.weight")).view(b, s, spec.heads, spec.head_dim)
        k = F.linear(h, p("attn.k.weight")).view(b, s, spec.num_kv_heads, spec.head_dim)
        v = F.linear(h, p("attn.v.weight")).view(b, s, spec.num_kv_heads, spec.head_dim)
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        x = x + F.linear(causal_attention(q, k, v), p("attn.o.weight"))
        h = rms_norm(x, p("mlp_norm.weight"))
        gate = F.linear(h, p("mlp.gate.weight")) if spec.gated else None
        return x + F.linear(mlp_activation(gate, F.linear(h, p("mlp.up.weight"))), p("mlp.down.weight"))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every token of the batch."""
        x = F.embedding(tokens, self.p("embed.weight"))
        for i in range(self.spec.layers):
            x = self._layer(i, x)
        logits = F.linear(rms_norm(x, self.p("norm.weight")), self.p("head.weight"))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
