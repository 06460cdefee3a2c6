"""The model being trained and the training settings (DESIGN.md §1), with the derived
sizes the cost model needs: parameters per layer, FLOPs per token, message sizes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.base import Frozen

ScheduleName = Literal["1f1b", "gpipe"]  # the keys of planner.schedules.SCHEDULES


class ModelSpec(Frozen):
    """A Llama-style decoder."""

    name: str = Field(default="model", description="model name")
    layers: int = Field(ge=1, description="L, transformer layers")
    hidden: int = Field(ge=1, description="h, hidden size")
    heads: int = Field(ge=1, description="a, attention heads")
    kv_heads: int | None = Field(default=None, ge=1, description="k, kv heads (GQA); default a")
    ffn_hidden: int = Field(ge=1, description="f, MLP hidden size")
    vocab: int = Field(ge=1, description="V, vocabulary size")
    gated: bool = Field(default=True, description="SwiGLU (three MLP matrices) or plain MLP (two)")

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.num_kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.num_kv_heads}")
        return self

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params_per_layer(self) -> int:
        """P_layer = h·(h + 2·k·d) + h·h + (3|2)·h·f + 2h."""
        h, k, d, f = self.hidden, self.num_kv_heads, self.head_dim, self.ffn_hidden
        return h * (h + 2 * k * d) + h * h + (3 if self.gated else 2) * h * f + 2 * h

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


class TrainingSpec(Frozen):
    seq_len: int = Field(ge=1, description="s, sequence length (tokens)")
    global_batch: int = Field(ge=1, description="B, sequences per iteration")
    micro_batch: int = Field(default=1, ge=1, description="b, sequences per micro-batch")
    recompute: bool = Field(default=True, description="full activation recomputation")
    param_state_bytes: float = Field(
        default=16, gt=0, description="μ, bytes of weights+grads+optimizer state per parameter"
    )
    grad_bytes: float = Field(default=2, gt=0, description="γ, bytes per gradient element on the wire")
    act_bytes: float = Field(default=2, gt=0, description="β, bytes per activation element")
    reserved_gib: float = Field(default=2, ge=0, description="R, per-device runtime reserve, GiB")
    schedule: ScheduleName = Field(
        default="1f1b", description="pipeline schedule: what runs and what memory is priced (§3.5 q)")
    token_block: int = Field(default=64, ge=1, description="q, sequence plans: every token count is a multiple of q (§7)")

    @model_validator(mode="after")
    def _check_batch(self) -> TrainingSpec:
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch {self.global_batch} is not a multiple of micro_batch {self.micro_batch}"
            )
        return self

    @property
    def micro_batches(self) -> int:
        """B / b: micro-batches of the whole iteration."""
        return self.global_batch // self.micro_batch
