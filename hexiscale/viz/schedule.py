"""The 1F1B timeline the cost model prices, block by block (docs/cost-model.md §3.3).

The cost model prices a pipeline as a flow line: each micro-batch costs stage k the time
τ_k (its forward and backward passes on that stage, TP traffic included) and link k→k+1 the
time T_pp,k (activation forward, gradient backward); in the steady state a new micro-batch
enters every cycle c = max_k max(τ_k, T_pp,k). The schedule drawn here is exactly that line:

    start(k, j) = j·c + Σ_{i<k} (τ_i + T_pp,i)     (stage k, micro-batch j)

stage k works on micro-batch j during [start, start + τ_k] and sends during
[start + τ_k, start + τ_k + T_pp,k]. Since τ_k ≤ c and T_pp,k ≤ c, no stage and no link ever
holds two blocks at once, and the last block ends at

    (m − 1)·c + Σ_k τ_k + Σ_{k<S} T_pp,k  =  T_pipe   (the §3.3 formula, exactly).

Each τ_k block is split into its forward share and its backward share for reading: the
forward share is C_σ / c_pass (one of the c_pass = 3|4 passes the compute term counts) plus
2 of the r TP all-reduces (Megatron all-reduces once after attention and once after the MLP
in a forward pass); the rest (backward, and the recomputed forward with recompute) is the
backward share. Everything a stage is not doing inside [0, T_pipe] is bubble. After the
slowest pipeline ends, every stage syncs its gradients (T_dp share of §3.4); the chart draws
that phase too, so its right edge is the iteration time T.

The cost model does not order a stage's forward and backward passes causally (the backward
of micro-batch j on stage k really waits for stage k+1); the chart shows the cost model's
accounting of 1F1B, which is what every solver optimizes — not a simulated trace.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from planner.cost import pass_multiplier
from planner.layered import cost
from planner.layered.estimate import Estimate
from planner.base import Frozen
from planner.problem import Problem

BlockKind = Literal["forward", "backward", "send", "dp_sync"]
FORWARD_TP_ROUNDS = 2  # all-reduces per layer in one forward pass (attention out, MLP out)


class Block(Frozen):
    stage: int = Field(ge=0, description="stage index k in its pipeline")
    kind: BlockKind
    micro_batch: int = Field(ge=-1, description="micro-batch j (-1 for the DP sync)")
    start: float = Field(ge=0, description="seconds from the start of the iteration")
    end: float = Field(ge=0)


class PipelineSchedule(Frozen):
    pipeline: int = Field(ge=0)
    num_stages: int = Field(ge=1)
    micro_batches: int = Field(ge=1, description="m_p")
    cycle_s: float = Field(ge=0, description="c = max_k max(τ_k, T_pp,k)")
    span_s: float = Field(ge=0, description="end of the last pipeline block: T_pipe")
    iteration_s: float = Field(ge=0, description="end of the DP sync: T")
    blocks: tuple[Block, ...]

    def of_kind(self, kind: BlockKind) -> list[Block]:
        return [b for b in self.blocks if b.kind == kind]

    def bubble_fraction(self, stage: int) -> float:
        """Share of [0, T_pipe] in which the stage computes nothing."""
        busy = sum(b.end - b.start for b in self.blocks
                   if b.stage == stage and b.kind in ("forward", "backward"))
        return 1.0 - busy / self.span_s if self.span_s > 0 else 0.0


def forward_share(problem: Problem, compute_s: float, tp_s: float) -> float:
    """Seconds of τ_σ spent in the forward pass (see the module docstring)."""
    forward_compute = compute_s / pass_multiplier(problem.training)
    forward_tp = tp_s * FORWARD_TP_ROUNDS / cost.tp_rounds(problem.training)
    return forward_compute + forward_tp


def pipeline_schedule(problem: Problem, estimate: Estimate, pipeline: int) -> PipelineSchedule:
    """Every block of pipeline `pipeline` under the cost model's 1F1B flow line."""
    pipe = estimate.pipelines[pipeline]
    tau = np.array([s.tau_s for s in pipe.stages])
    pp = np.array([s.pp_s for s in pipe.stages])
    cycle = float(np.maximum(tau, pp).max())
    offsets = np.concatenate([[0.0], np.cumsum(tau + pp)[:-1]])
    blocks: list[Block] = []
    for k, st in enumerate(pipe.stages):
        fwd = forward_share(problem, st.compute_s, st.tp_s)
        for j in range(pipe.micro_batches):
            t0 = j * cycle + offsets[k]
            blocks.append(Block(stage=k, kind="forward", micro_batch=j, start=t0, end=t0 + fwd))
            blocks.append(Block(stage=k, kind="backward", micro_batch=j, start=t0 + fwd, end=t0 + st.tau_s))
            if st.pp_s > 0:
                blocks.append(Block(stage=k, kind="send", micro_batch=j,
                                    start=t0 + st.tau_s, end=t0 + st.tau_s + st.pp_s))
    dp_start = estimate.pipe_s  # gradients sync once the slowest pipeline has drained
    for k, st in enumerate(pipe.stages):
        if st.dp_s > 0:
            blocks.append(Block(stage=k, kind="dp_sync", micro_batch=-1, start=dp_start, end=dp_start + st.dp_s))
    span = max(b.end for b in blocks if b.kind != "dp_sync")
    return PipelineSchedule(
        pipeline=pipeline, num_stages=len(pipe.stages), micro_batches=pipe.micro_batches,
        cycle_s=cycle, span_s=span, iteration_s=estimate.iteration_s, blocks=tuple(blocks),
    )
