"""What the evaluator returns: iteration time with every part of docs/cost-model.md §3."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from planner.base import Frozen
from planner.headline import Headline


class StageEstimate(Frozen):
    pipeline: int = Field(ge=0)
    index: int = Field(ge=0, description="k, position in the pipeline")
    machine: str = Field(description="machine holding the stage")
    devices: tuple[int, ...]
    tp: int = Field(ge=1, description="t, tensor-parallel size")
    layers: int = Field(ge=1, description="n")
    first_layer: int = Field(ge=0)
    compute_s: float = Field(ge=0, description="C_σ per micro-batch")
    tp_s: float = Field(ge=0, description="T_tp,σ per micro-batch")
    tau_s: float = Field(ge=0, description="τ_σ = C_σ + T_tp,σ")
    forward_s: float = Field(ge=0, description="of τ_σ, the forward pass: C_σ/c + 2·T_tp,σ/r (the simulated "
                                               "schedule's; the backward is the rest)")
    pp_s: float = Field(ge=0, description="T_pp to the next stage per micro-batch (0 for the last)")
    dp_s: float = Field(ge=0, description="Σ τ_dp over the layers this stage holds")
    memory_gib: float = Field(ge=0, description="W + Act + R per device")
    states_gib: float = Field(ge=0, description="W_σ: weights, gradients and optimizer state per device")
    activations_gib: float = Field(ge=0, description="Act_σ: kept activations, working layer and logits per device")
    capacity_gib: float = Field(gt=0)
    headroom_gib: float = Field(description="capacity − memory; negative means out of memory")


class PipelineEstimate(Frozen):
    index: int = Field(ge=0)
    batch: int = Field(ge=1, description="B_p")
    micro_batches: int = Field(ge=1, description="m_p")
    time_s: float = Field(ge=0, description="T_pipe (1F1B)")
    bubble_s: float = Field(ge=0, description="fill and drain: Σ τ + Σ T_pp")
    steady_s: float = Field(ge=0, description="(m−1)·max_k max(τ_k, T_pp,k)")
    simulated_s: float = Field(ge=0, description="the makespan of the schedule simulated event by event from the "
                                                 "stages' forward, backward and send times (§3.3); reported beside "
                                                 "T_pipe, not the objective")
    stages: tuple[StageEstimate, ...]


BottleneckKind = Literal["compute", "tensor_parallel", "pipeline_parallel", "data_parallel"]


class Bottleneck(Frozen):
    kind: BottleneckKind
    pipeline: int | None = Field(default=None, description="pipeline of the limiting stage")
    stage: int | None = Field(default=None, description="index of the limiting stage")
    seconds: float = Field(ge=0, description="the term's share of the iteration time")
    description: str


class Estimate(Headline):
    pipe_s: float = Field(ge=0, description="max_p T_pipe")
    dp_s: float = Field(ge=0, description="T_dp")
    simulated_s: float = Field(gt=0, description="max_p simulated T_pipe + T_dp: T with the schedule simulated "
                                                 "(§3.3); reported, not the objective")
    min_headroom_gib: float = Field(description="smallest headroom over every used device")
    pipelines: tuple[PipelineEstimate, ...]
    bottleneck: Bottleneck

    @property
    def stages(self) -> list[StageEstimate]:
        return [s for p in self.pipelines for s in p.stages]
