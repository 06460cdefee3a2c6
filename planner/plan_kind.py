"""What the planner needs to know of a plan kind (DESIGN.md §2 layered plans, §7 sequence
plans): its plan type and file format, and the functions that judge a plan of that kind.

Each kind lives in its own folder (`planner/layered/`, ...) and describes itself with one
`PlanKind`; `planner.kinds` lists the kinds and dispatches on a plan's type, so that a new kind
arrives as a new folder and one line there, never as a branch inside another kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.base import Frozen
from planner.problem import Problem
from planner.violations import Violation


@dataclass(frozen=True)
class PlanKind:
    name: str  # "layered", ...: the folder name of the kind's planner, solvers and runtime
    format: str  # the plan file's "format" tag
    plan_type: type[Frozen]
    validate: Callable[[Problem, Any], list[Violation]]  # every violated rule, with numbers
    evaluate: Callable[[Problem, Any], Frozen]  # the typed estimate (raises InvalidPlanError)
    iteration_time: Callable[[Problem, Any], float]  # T only: the solvers' fast path
