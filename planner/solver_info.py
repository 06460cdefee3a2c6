"""How a plan was found: shared by every plan kind and every solver (docs/solvers.md §5)."""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from planner.base import Frozen


class SolveStatus(str, Enum):
    optimal = "optimal"
    feasible = "feasible"
    infeasible = "infeasible"
    unknown = "unknown"


class SolverInfo(Frozen):
    name: str = Field(description="solver that produced the plan")
    status: SolveStatus = Field(description="optimal | feasible | infeasible | unknown")
    objective_s: float | None = Field(default=None, ge=0, description="solver's iteration time, s")
    bound_s: float | None = Field(default=None, ge=0, description="proven lower bound, s")
    wall_s: float | None = Field(default=None, ge=0, description="solve wall time, s")
