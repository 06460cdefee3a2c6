"""A plan flattened into per-stage numpy arrays: what the cost model indexes.

Stages are listed pipeline by pipeline in pipeline order, so one pipeline's stages are a
contiguous slice `[pipe_start[p], pipe_start[p+1])`. Building the table assumes the plan is
structurally sound (devices exist, a stage sits on one machine, Σ n = L); `validate` checks
that first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.layered.plan import Plan
from planner.problem import Problem


@dataclass(frozen=True)
class StageTable:
    pipe: np.ndarray  # pipeline index of each stage
    index: np.ndarray  # k, position inside its pipeline (0-based)
    num_stages: np.ndarray  # S of its pipeline
    machine: np.ndarray  # machine index of the stage's devices
    tp: np.ndarray  # t
    layers: np.ndarray  # n
    first_layer: np.ndarray  # start of its layer range
    first: np.ndarray  # 1 if it holds the embedding
    last: np.ndarray  # 1 if it holds the LM head
    micro_batches: np.ndarray  # m_p of its pipeline
    pipe_start: np.ndarray  # offsets of each pipeline's stages, length D+1
    batch: np.ndarray  # B_p per pipeline

    @property
    def num_pipelines(self) -> int:
        return len(self.batch)

    def per_pipeline(self, values: np.ndarray) -> list[np.ndarray]:
        """A per-stage array cut into one slice per pipeline (its stages in order)."""
        bounds = self.pipe_start
        return [values[bounds[p]: bounds[p + 1]] for p in range(self.num_pipelines)]


def first_layers(layers: np.ndarray, pipe: np.ndarray, pipe_start: np.ndarray) -> np.ndarray:
    """Start of each stage's layer range: cumulative layers, restarted at each pipeline [2]."""
    cum = np.cumsum(layers) - layers
    return cum - cum[pipe_start[:-1]][pipe]


def table_of_stages(*, sizes: np.ndarray, machine: np.ndarray, tp: np.ndarray, layers: np.ndarray,
                    batch: np.ndarray, micro_batch: int) -> StageTable:
    """The table of stages listed pipeline by pipeline: `sizes[p]` stages in pipeline p (its S),
    per stage its machine, t and n, per pipeline its B_p; b is the training's micro-batch."""
    sizes = np.asarray(sizes)
    pipe = np.repeat(np.arange(len(sizes)), sizes)
    pipe_start = np.concatenate([[0], np.cumsum(sizes)])
    index = np.arange(len(pipe)) - pipe_start[pipe]
    num_stages = sizes[pipe]
    return StageTable(
        pipe=pipe,
        index=index,
        num_stages=num_stages,
        machine=machine,
        tp=tp,
        layers=layers,
        first_layer=first_layers(layers, pipe, pipe_start),
        first=(index == 0).astype(int),
        last=(index == num_stages - 1).astype(int),
        micro_batches=(batch // micro_batch)[pipe],
        pipe_start=pipe_start,
        batch=batch,
    )


def stage_table(problem: Problem, plan: Plan) -> StageTable:
    stages = [s for p in plan.pipelines for s in p.stages]
    return table_of_stages(
        sizes=np.array([len(p.stages) for p in plan.pipelines]),
        machine=problem.cluster.machine_of_device[[s.devices[0] for s in stages]],
        tp=np.array([len(s.devices) for s in stages]),
        layers=np.array([s.layers for s in stages]),
        batch=np.array([p.batch for p in plan.pipelines]),
        micro_batch=problem.training.micro_batch,
    )
