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


def stage_table(problem: Problem, plan: Plan) -> StageTable:
    micro = problem.training.micro_batch
    machine_of = problem.cluster.machine_of_device
    sizes = [len(p.stages) for p in plan.pipelines]
    pipe = np.repeat(np.arange(len(sizes)), sizes)
    pipe_start = np.concatenate([[0], np.cumsum(sizes)])
    index = np.arange(len(pipe)) - pipe_start[pipe]
    stages = [s for p in plan.pipelines for s in p.stages]
    layers = np.array([s.layers for s in stages])
    # first layer of each stage: cumulative layers restarted at each pipeline
    cum = np.cumsum(layers) - layers
    first_layer = cum - cum[pipe_start[:-1]][pipe]
    num_stages = np.asarray(sizes)[pipe]
    batch = np.array([p.batch for p in plan.pipelines])
    return StageTable(
        pipe=pipe,
        index=index,
        num_stages=num_stages,
        machine=machine_of[[s.devices[0] for s in stages]],
        tp=np.array([len(s.devices) for s in stages]),
        layers=layers,
        first_layer=first_layer,
        first=(index == 0).astype(int),
        last=(index == num_stages - 1).astype(int),
        micro_batches=(batch // micro)[pipe],
        pipe_start=pipe_start,
        batch=batch,
    )
