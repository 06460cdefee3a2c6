"""The model being trained and the training settings (docs/plan-space.md §1), with the derived
sizes the cost model needs: parameters per layer, FLOPs per token, message sizes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from planner.base import Input, Name

ScheduleName = Literal["1f1b", "gpipe"]  # the keys of planner.schedules.SCHEDULES
ZeroStage = Literal[0, 1]  # docs: ZeRO-1 across asymmetric pipelines

# Upper limits on model and training sizes, each far beyond any real model (the largest have
# about 130 layers, h ≈ 2.5·10^4, V ≈ 2.6·10^5, contexts of 10^7 tokens): a larger figure is a
# typo, and far past them the cost model's arithmetic overflows (a hidden size of 2^70 did).
MAX_LAYERS = 10**4
MAX_WIDTH = 2**20  # hidden, heads, kv heads, ffn hidden
MAX_VOCAB = 2**24
MAX_TOKENS = 2**24  # seq_len and token_block: 1.7·10^7 tokens
# global_batch and micro_batch, sequences: 1.1·10^12, the largest batch tests/test_planner_scale.py
# plans (10^12); with s ≤ MAX_TOKENS the tokens of an iteration stay below 2^64
MAX_BATCH = 2**40
MAX_BYTES = 1024.0  # bytes per parameter or element (16 for mixed-precision Adam)
MAX_RESERVED_GIB = 1e6  # as the largest device memory (planner.hardware.MAX_MEMORY_GIB)


class ModelSpec(Input):
    """A Llama-style decoder."""

    name: Name = Field(default="model", description="model name")
    layers: int = Field(ge=1, le=MAX_LAYERS, description="L, transformer layers")
    hidden: int = Field(ge=1, le=MAX_WIDTH, description="h, hidden size")
    heads: int = Field(ge=1, le=MAX_WIDTH, description="a, attention heads")
    kv_heads: int | None = Field(default=None, ge=1, le=MAX_WIDTH, description="k, kv heads (GQA); default a")
    ffn_hidden: int = Field(ge=1, le=MAX_WIDTH, description="f, MLP hidden size")
    vocab: int = Field(ge=1, le=MAX_VOCAB, description="V, vocabulary size")
    # booleans strict: a quoted "false" or a 0 read as a switch is probably a mistake
    gated: bool = Field(default=True, strict=True, description="SwiGLU (three MLP matrices) or plain MLP (two)")
    qkv_bias: bool = Field(default=False, strict=True, description="biases on the q, k, v projections (Qwen2)")
    tied_embeddings: bool = Field(
        default=False, strict=True, description="the LM head shares the embedding's matrix (priced as two synced copies)")
    # runtime only (docs/models-and-data.md §12): the numbers the runtime's decoder needs, no cost-model term
    rope_theta: float = Field(default=10000.0, gt=0, description="rotary embeddings' base (runtime only)")
    norm_eps: float = Field(default=1e-5, gt=0, le=1, description="RMSNorm epsilon (runtime only)")
    # set by the Hugging Face reader, not written in files: hidden from the printed schema
    hf_folder: SkipJsonSchema[str] = Field(
        default="", description="the Hugging Face model folder it was read from (weights, tokenizer; runtime only); "
                                "empty: none")

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.num_kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.num_kv_heads}")
        if (self.hidden // self.heads) % 2:  # rotary embeddings turn pairs of a head's dimensions
            raise ValueError(f"head dimension hidden/heads = {self.hidden}/{self.heads} = {self.hidden // self.heads} "
                             f"is odd; rotary embeddings need it even")
        return self

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def qkv_width(self) -> int:
        """h + 2·k·d: the output width of the q, k, v projections together."""
        return self.hidden + 2 * self.num_kv_heads * self.head_dim

    @property
    def matrix_params(self) -> int:
        """P_mm = h·(h + 2·k·d) + h·h + (3|2)·h·f: a layer's matrix weights (what its GEMMs multiply)."""
        h, f = self.hidden, self.ffn_hidden
        return h * self.qkv_width + h * h + (3 if self.gated else 2) * h * f

    @property
    def params_per_layer(self) -> int:
        """P_layer = P_mm + 2h + [qkv_bias]·(h + 2·k·d): matrices, two norms, the qkv biases."""
        return self.matrix_params + 2 * self.hidden + (self.qkv_width if self.qkv_bias else 0)

    @property
    def params_embedding(self) -> int:
        """P_emb = V·h."""
        return self.vocab * self.hidden

    @property
    def params_head(self) -> int:
        """P_head = V·h + h (final norm included)."""
        return self.vocab * self.hidden + self.hidden

    @property
    def total_params(self) -> int:
        return self.layers * self.params_per_layer + self.params_embedding + self.params_head

    def tp_misfits(self, tp: int) -> list[str]:
        """What a TP group of `tp` devices cannot split into equal blocks (Megatron TP shards
        heads, kv heads, ffn hidden and the vocabulary), as "heads (12)"; empty when it fits."""
        sizes = (("heads", self.heads), ("kv heads", self.num_kv_heads), ("ffn hidden", self.ffn_hidden),
                 ("vocab", self.vocab))
        return [f"{what} ({size})" for what, size in sizes if size % tp]

    def tp_sizes(self, max_size: int) -> list[int]:
        """Powers of two ≤ max_size dividing both a and k: the allowed TP group sizes."""
        sizes, t = [], 1
        while t <= max_size:
            if self.heads % t == 0 and self.num_kv_heads % t == 0:
                sizes.append(t)
            t *= 2
        return sizes


class TrainingSpec(Input):
    seq_len: int = Field(ge=1, le=MAX_TOKENS, description="s, sequence length (tokens)")
    global_batch: int = Field(ge=1, le=MAX_BATCH, description="B, sequences per iteration")
    micro_batch: int = Field(default=1, ge=1, le=MAX_BATCH, description="b, sequences per micro-batch")
    recompute: bool = Field(default=True, strict=True, description="full activation recomputation")
    param_state_bytes: float = Field(
        default=16, gt=0, le=MAX_BYTES, description="μ, bytes of weights+grads+optimizer state per parameter"
    )
    grad_bytes: float = Field(default=2, gt=0, le=MAX_BYTES, description="γ, bytes per gradient element on the wire")
    act_bytes: float = Field(default=2, gt=0, le=MAX_BYTES, description="β, bytes per activation element")
    reserved_gib: float = Field(default=2, ge=0, le=MAX_RESERVED_GIB,
                                description="R, per-device runtime reserve, GiB")
    schedule: ScheduleName = Field(
        default="1f1b", description="pipeline schedule: what runs and what memory is priced (§3.5 q)")
    token_block: int = Field(default=64, ge=1, le=MAX_TOKENS,
                             description="q, sequence plans: every token count is a multiple of q (§7)")
    sequence_parallel: bool = Field(
        default=False, strict=True, description="Megatron sequence parallelism inside TP stages: norms, residuals and "
                                   "the kept layer input split over the t devices (§3.5 memory)")
    zero_stage: ZeroStage = Field(
        default=0, description="0: every pipeline keeps its whole optimizer state; 1: the D holders of a "
                               "chunk shard its optimizer state and master weights (§11)")
    weight_bytes: float = Field(default=2, gt=0, le=MAX_BYTES,
                                description="μ_w, bytes per parameter of the weights the forward pass reads (part of μ)")
    optimizer_bytes: float = Field(default=12, ge=0, le=MAX_BYTES,
                                   description="μ_o, bytes per parameter of master weights and Adam moments (part of μ)")

    @model_validator(mode="after")
    def _check_batch(self) -> TrainingSpec:
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch {self.global_batch} is not a multiple of micro_batch {self.micro_batch}"
            )
        return self

    @model_validator(mode="after")
    def _check_state_bytes(self) -> TrainingSpec:
        """μ = μ_w + gradients + μ_o: the two named parts cannot exceed the whole."""
        if self.weight_bytes + self.optimizer_bytes > self.param_state_bytes:
            raise ValueError(
                f"weight_bytes {self.weight_bytes:g} + optimizer_bytes {self.optimizer_bytes:g} exceed "
                f"param_state_bytes {self.param_state_bytes:g} (μ = weights + gradients + optimizer state)")
        return self

    @property
    def gradient_state_bytes(self) -> float:
        """μ − μ_w − μ_o: bytes per parameter of the gradients kept in memory."""
        return self.param_state_bytes - self.weight_bytes - self.optimizer_bytes

    @property
    def micro_batches(self) -> int:
        """B / b: micro-batches of the whole iteration."""
        return self.global_batch // self.micro_batch
