"""The model's parameter catalogue (no torch): every parameter's name, full shape and how a TP
group splits it, by sync unit (0 = embedding, i+1 = layer i, L+1 = final norm and head), and
the distinct tensors a checkpoint or a Hugging Face folder holds (a tied head is the
embedding). `runtime.model.llama` builds and computes with them; the launcher checks a model
folder against them before any process (and torch) starts.
"""

from __future__ import annotations

from planner.workload import ModelSpec

# How each parameter is split across a TP group: dim 0 = column-parallel (output rows, and
# their biases) or vocab-parallel; dim 1 = row-parallel (input columns); None = replicated (norms).
LAYER_SHARD_DIMS = {
    "attn_norm.weight": None, "attn.q.weight": 0, "attn.k.weight": 0, "attn.v.weight": 0,
    "attn.q.bias": 0, "attn.k.bias": 0, "attn.v.bias": 0,
    "attn.o.weight": 1, "mlp_norm.weight": None, "mlp.gate.weight": 0, "mlp.up.weight": 0,
    "mlp.down.weight": 1,
}
EMBEDDING, HEAD = "embed.weight", "head.weight"
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
    if spec.qkv_bias:
        shapes.update({"attn.q.bias": (spec.heads * d,), "attn.k.bias": (spec.num_kv_heads * d,),
                       "attn.v.bias": (spec.num_kv_heads * d,)})
    return shapes


def unit_params(spec: ModelSpec, unit: int) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Full names → (full shape, shard dim) of a sync unit (0 = emb, i+1 = layer i, L+1 = head)."""
    if unit == 0:
        return {"embed.weight": ((spec.vocab, spec.hidden), 0)}
    if unit == spec.layers + 1:
        return {"norm.weight": ((spec.hidden,), None), "head.weight": ((spec.vocab, spec.hidden), 0)}
    return {f"layers.{unit - 1}.{name}": (shape, LAYER_SHARD_DIMS[name])
            for name, shape in layer_param_shapes(spec).items()}


def stored_name(spec: ModelSpec, name: str) -> str:
    """The tensor a parameter is a copy of: with tied embeddings the LM head (a last stage's
    own copy) is the embedding, the one tensor a checkpoint or a model file holds."""
    return EMBEDDING if spec.tied_embeddings and name == HEAD else name


def model_tensors(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every distinct tensor of the model by name (the head left out when tied): what
    checkpoints and Hugging Face files hold."""
    return {name: shape for unit in range(spec.layers + 2) for name, (shape, _) in unit_params(spec, unit).items()
            if stored_name(spec, name) == name}
