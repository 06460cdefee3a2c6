"""A problem = cluster + model + training (docs/plan-space.md §1), and what to optimize: the
iteration time, or the cost per token, under an optional budget per hour (docs/prices.md §13)."""

from __future__ import annotations

from enum import Enum

from pydantic import Field, model_validator

from planner.base import Input, Name

from planner.hardware import Cluster
from planner.workload import ModelSpec, TrainingSpec


class Objective(str, Enum):
    """What a solver minimizes (§13): T, or the cost per token rent·T / (3600·B·s). A str enum
    that prints as its value (enum.StrEnum is Python 3.11+; the package supports 3.10)."""

    time = "time"
    cost = "cost"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class Problem(Input):
    name: Name = Field(default="problem", description="problem name, echoed in plan files")
    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    objective: Objective = Field(
        default=Objective.time, description="time: minimize T; cost: minimize the cost per token (§13)")
    budget_per_hour: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="most the rented machines may cost per hour (Σ count·price over machines a plan uses)")

    @model_validator(mode="after")
    def _reserve_below_memory(self) -> Problem:
        """A reserve at or above every device's memory leaves nothing for the model anywhere:
        surely a mistake (GiB for MiB, or a total), said here rather than as "no plan fits"."""
        # by GPU type, not machine_memory_bytes: a cached array in the cluster's __dict__ breaks
        # pydantic's == between two equal problems (numpy's truth value of an array)
        catalog = self.cluster.catalog
        largest = max(catalog[gpu].memory_gib for gpu in {m.gpu for m in self.cluster.machines})
        if self.training.reserved_gib >= largest:
            raise ValueError(f"training.reserved_gib {self.training.reserved_gib:g} GiB is at least the largest "
                             f"device's memory ({largest:g} GiB): no device keeps any memory for the model")
        return self

    @model_validator(mode="after")
    def _prices_for_cost(self) -> Problem:
        """A budget or the cost objective needs a price on every machine: one missing would make
        that machine free, which no solver should believe."""
        needs = ("budget_per_hour" if self.budget_per_hour is not None
                 else "objective: cost" if self.objective == Objective.cost else None)
        missing = self.cluster.unpriced_machine() if needs else None
        if missing is not None:
            machine = self.cluster.machines[missing]
            raise ValueError(
                f"{needs} needs a price on every machine: cluster.machines[{missing}].price_per_hour "
                f"({machine.name}) is missing, and so is price_per_hour of its GPU type {machine.gpu} "
                f"(set either one)")
        return self
