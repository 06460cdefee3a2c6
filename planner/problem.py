"""A problem = cluster + model + training (docs/plan-space.md §1)."""

from __future__ import annotations

from pydantic import Field

from planner.base import Frozen

from planner.hardware import Cluster
from planner.workload import ModelSpec, TrainingSpec


class Problem(Frozen):
    name: str = Field(default="problem", description="problem name, echoed in plan files")
    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
