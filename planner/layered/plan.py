"""The plan: pipelines (data-parallel replicas) of stages (tensor-parallel groups) — DESIGN.md §2, §4.

A plan is typed data only; `planner.validate` checks it against a problem and
`planner.evaluate` prices it. Structural rules that need no problem (non-empty stages, a
device named once inside a stage) are checked here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from planner.base import Frozen
from planner.solver_info import SolverInfo

PLAN_FORMAT = "hexiscale.plan/1"


class Stage(Frozen):
    devices: tuple[int, ...] = Field(min_length=1, description="global device ids; TP group of size t")
    layers: int = Field(ge=1, description="n, transformer layers held by this stage")

    @field_validator("devices")
    @classmethod
    def _distinct_devices(cls, devices: tuple[int, ...]) -> tuple[int, ...]:
        if any(d < 0 for d in devices):
            raise ValueError(f"device ids must be ≥ 0, got {list(devices)}")
        if len(set(devices)) != len(devices):
            raise ValueError(f"a stage names a device twice: {list(devices)}")
        return devices

    @property
    def tp(self) -> int:
        return len(self.devices)

    @property
    def leader(self) -> int:
        """The device that exchanges activations with neighbouring stages."""
        return self.devices[0]


class Pipeline(Frozen):
    batch: int = Field(ge=1, description="B_p, sequences per iteration for this replica")
    stages: tuple[Stage, ...] = Field(min_length=1, description="stages in pipeline order")

    @property
    def layers(self) -> int:
        return sum(s.layers for s in self.stages)

    def layer_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of each stage's layers."""
        ranges, start = [], 0
        for s in self.stages:
            ranges.append((start, start + s.layers))
            start += s.layers
        return ranges


class Plan(Frozen):
    format: Literal["hexiscale.plan/1"] = Field(default=PLAN_FORMAT, description="file format tag")
    problem: str = Field(default="", description="name of the problem the plan is for")
    pipelines: tuple[Pipeline, ...] = Field(min_length=1, description="data-parallel replicas")
    solver: SolverInfo | None = Field(default=None, description="how the plan was found")

    @property
    def devices(self) -> list[int]:
        return [d for p in self.pipelines for s in p.stages for d in s.devices]

    @property
    def num_stages(self) -> int:
        return sum(len(p.stages) for p in self.pipelines)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True)
