"""What is wrong with a plan: one violated rule with its numbers, and the error that carries
every violation when a plan cannot be priced. Shared by every plan kind."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from planner.base import Frozen

Rule = Literal["device", "machine", "tp_size", "layers", "batch", "memory", "heads", "tokens", "shards", "vendor"]


class Violation(Frozen):
    rule: Rule = Field(description="which rule of docs/plan-space.md §2 is broken")
    message: str
    pipeline: int | None = None
    stage: int | None = None

    def __str__(self) -> str:
        where = []
        if self.pipeline is not None:
            where.append(f"pipeline {self.pipeline}")
        if self.stage is not None:
            where.append(f"stage {self.stage}")
        return f"[{self.rule}] " + (" ".join(where) + ": " if where else "") + self.message


class InvalidPlanError(ValueError):
    """Raised when a plan cannot be priced; carries every violation found."""

    def __init__(self, violations):
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"plan is invalid ({len(self.violations)} violations):\n{lines}")
