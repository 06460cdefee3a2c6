"""The plan: pipelines (data-parallel replicas) of stages (tensor-parallel groups) — docs/plan-space.md §2, §4.

A plan is typed data only; `planner.validate` checks it against a problem and
`planner.evaluate` prices it. Structural rules that need no problem (non-empty stages, a
device named once inside a stage) are checked here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from planner.base import Frozen
from planner.solver_info import SolverInfo
from planner.base import plural, sizes_phrase

PLAN_FORMAT = "hexiscale.plan/1"

StageSpec = tuple[Sequence[int], int]  # (devices, layers) of one stage, before it is a `Stage`
MAX_DEVICE_ID = 2**31 - 1  # far beyond any cluster; larger ids overflow the evaluator's int64 arrays


def whole_numbers(value: Any, what: str) -> Any:
    """Counts and ids are written as integers: `true` (which would read as 1), "0" or 2.0 in a
    plan file is probably a mistake, so it is refused rather than converted (anything else
    that is not an integer is left to pydantic's own error)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    bad = [x for x in items if isinstance(x, (bool, float)) or (isinstance(x, str) and x.strip().lstrip("+-").isdigit())]
    if bad:
        # the loader's message ends with the value given; only an item of a list is named here
        got = f", got {bad[0]!r}" if isinstance(value, (list, tuple)) else ""
        raise ValueError(f"{what} must be written as integers{got}")
    return value


class Stage(Frozen):
    devices: tuple[int, ...] = Field(min_length=1, description="global device ids; TP group of size t")
    layers: int = Field(ge=1, description="n, transformer layers held by this stage")

    @field_validator("devices", "layers", mode="before")
    @classmethod
    def _integers(cls, value: Any, info) -> Any:
        return whole_numbers(value, "device ids" if info.field_name == "devices" else info.field_name)

    @field_validator("devices")
    @classmethod
    def _distinct_devices(cls, devices: tuple[int, ...]) -> tuple[int, ...]:
        if any(d < 0 for d in devices):
            raise ValueError(f"device ids must be ≥ 0, got {list(devices)}")
        if any(d > MAX_DEVICE_ID for d in devices):
            raise ValueError(f"device id {max(devices)} is beyond any cluster (ids are at most 2^31 − 1)")
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

    @field_validator("batch", mode="before")
    @classmethod
    def _integer_batch(cls, value: Any) -> Any:
        return whole_numbers(value, "batch")

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

    @classmethod
    def from_stages(cls, *, problem: str, batches: Sequence[int],
                    stages: Sequence[Sequence[StageSpec]]) -> Plan:
        """The plan whose pipeline p has batch `batches[p]` (sequences, B_p) and, in pipeline
        order, one stage per `(devices, layers)` of `stages[p]`; `problem` is the problem's name.

        The one place a solver turns its own stage lists into a `Plan`. Counts and ids may be
        numpy integers; they are stored as Python ints."""
        if len(batches) != len(stages):
            raise ValueError(f"{len(batches)} batches for {plural(len(stages), 'pipeline')}")
        return cls(problem=problem, pipelines=tuple(
            Pipeline(batch=int(batch), stages=tuple(
                Stage(devices=tuple(int(d) for d in devices), layers=int(layers)) for devices, layers in pipe))
            for batch, pipe in zip(batches, stages)))

    @property
    def devices(self) -> list[int]:
        return [d for p in self.pipelines for s in p.stages for d in s.devices]

    @property
    def global_batch(self) -> int:
        """B: the sequences of one iteration, over every pipeline."""
        return sum(p.batch for p in self.pipelines)

    @property
    def num_stages(self) -> int:
        return sum(len(p.stages) for p in self.pipelines)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True)


def devices_in_order(first_device: Sequence[int], shapes: Sequence[Sequence[tuple[int, int]]],
                     ) -> list[list[tuple[int, ...]]]:
    """Concrete devices for stages given as (machine, t), pipeline by pipeline: each machine
    hands out its devices in id order, from `first_device[machine]` on (devices of one machine
    are interchangeable, so any order gives the same T)."""
    free = [int(x) for x in first_device]
    out = []
    for pipe in shapes:
        devices = []
        for machine, t in pipe:
            devices.append(tuple(range(free[machine], free[machine] + t)))
            free[machine] += t
        out.append(devices)
    return out


def outline(plan: Plan) -> str:
    """The plan's structure in one phrase: pipelines, stages, devices and each stage's TP."""
    return (f"D={len(plan.pipelines)}, {plural(plan.num_stages, 'stage')}, {plural(len(plan.devices), 'device')}, "
            f"TP {sizes_phrase([s.tp for p in plan.pipelines for s in p.stages])}")
