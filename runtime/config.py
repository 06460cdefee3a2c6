"""What a run needs besides the plan: the model actually trained and the run settings.

`tiny_model` shrinks a problem's model for a small-scale run of any plan: it keeps the layer
count L (the plan's layer split stays valid) and makes heads, kv heads, ffn hidden and the
vocabulary divisible by every TP size of the plan (the plan's TP groups stay valid).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from planner.base import Frozen
from planner.layered.plan import Plan
from planner.workload import ModelSpec

BYTE_VOCAB = 256
DataName = Literal["synthetic", "corpus"]
Schedule = Literal["1f1b", "gpipe"]
Backend = Literal["gloo", "nccl"]
TINY_HEAD_DIM = 8
TINY_MIN_HIDDEN = 32


class RunConfig(Frozen):
    model: ModelSpec = Field(description="the model actually trained")
    seq_len: int = Field(ge=1, description="tokens per sequence")
    micro_batch: int = Field(ge=1, description="b, sequences per micro-batch")
    steps: int = Field(default=3, ge=1, description="optimizer steps")
    schedule: Schedule = Field(default="1f1b", description="pipeline schedule")
    recompute: bool = Field(default=False, description="full activation recomputation")
    data: DataName = Field(default="synthetic", description="token source")
    lr: float = Field(default=1e-3, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay")
    seed: int = Field(default=0, ge=0, description="seeds weights and data")
    backend: Backend = Field(default="gloo", description="torch.distributed backend")
    timeout_s: float = Field(default=60, gt=0, description="bound on any collective's wait")
    check_replicas: bool = Field(default=True, description="check replica equality after the last step")
    out_dir: str = Field(default="", description="folder for metrics and parameter shards")
    dump_params: bool = Field(default=False, description="write every rank's shards to out_dir")
    machine_devices: tuple[tuple[int, ...], ...] = Field(
        default=(), description="device ids of each machine (torchrun launches only)")
    fail_rank: int = Field(default=-1, description="test hook: this rank dies mid-step")
    fail_step: int = Field(default=0, ge=0, description="test hook: the step it dies in")
    fail_mode: Literal["kill", "hang"] = Field(default="kill", description="test hook: die, or stop answering")


class Job(Frozen):
    """Everything a worker process reads: the plan and the run settings."""

    plan: Plan
    config: RunConfig


def _tiny_heads(model: ModelSpec, tp_max: int) -> tuple[int, int]:
    """kv heads: a multiple of the largest TP size; query heads keep the model's GQA ratio
    (capped at 2); at least TINY_MIN_HIDDEN hidden units."""
    ratio, kv_heads = min(model.heads // model.num_kv_heads, 2), tp_max
    while kv_heads * ratio * TINY_HEAD_DIM < TINY_MIN_HIDDEN:
        kv_heads *= 2
    return kv_heads * ratio, kv_heads


def tiny_model(model: ModelSpec, plan: Plan) -> ModelSpec:
    """A small model with the same L whose sizes every TP group of `plan` can split."""
    tp_max = max(s.tp for p in plan.pipelines for s in p.stages)
    heads, kv_heads = _tiny_heads(model, tp_max)
    hidden = heads * TINY_HEAD_DIM
    multiple = max(tp_max, 8)  # plans with TP ≤ 8 (and the same kv heads) get the same model
    ffn = -(-(8 * hidden // 3) // multiple) * multiple  # ≈ 8h/3 as in Llama
    vocab = max(BYTE_VOCAB, tp_max)
    return ModelSpec(name=f"tiny({model.name})", layers=model.layers, hidden=hidden, heads=heads,
                     kv_heads=kv_heads, ffn_hidden=ffn, vocab=vocab, gated=model.gated)


def check_model_fits(spec: ModelSpec, tp_sizes: list[int]) -> None:
    """Every TP size must split heads, kv heads, ffn and vocabulary into equal blocks."""
    for t in sorted(set(tp_sizes)):
        for what, size in (("heads", spec.heads), ("kv heads", spec.num_kv_heads),
                           ("ffn hidden", spec.ffn_hidden), ("vocab", spec.vocab)):
            if size % t:
                raise ValueError(f"TP size {t} does not divide the model's {what} ({size}) "
                                 f"of model {spec.name!r}")
