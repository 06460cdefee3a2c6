"""What the planner needs to know of a plan kind (docs/plan-space.md §2 layered plans, §7 sequence
plans): its plan type and file format, the functions that judge a plan of that kind, and
what shared code asks of a plan without knowing its kind (its units, its shape, F_iter, the
rows a run of it measures).

Each kind lives in its own folder (`planner/layered/`, ...) and describes itself with one
`PlanKind`; `planner.kinds` lists the kinds and dispatches on a plan's type, so that a new kind
arrives as a new folder and one line there, never as a branch inside another kind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.base import Frozen
from planner.problem import Problem
from planner.violations import Violation
from planner.workload import ModelSpec, TrainingSpec

# (collective kind, unit index): one of the collective times a run record measured, e.g.
# ("tp", 2): stage 2's TP collectives; ("hp", 0): replica 0's head-parallel all-to-alls
CollectiveRow = tuple[str, int]


@dataclass(frozen=True)
class PlanKind:
    name: str  # "layered", ...: the folder name of the kind's planner, solvers and runtime
    format: str  # the plan file's "format" tag
    schema_name: str  # the plan file's JSON schema name (`hexiscale schema --type`)
    plan_type: type[Frozen]
    validate: Callable[[Problem, Any], list[Violation]]  # every violated rule, with numbers
    evaluate: Callable[[Problem, Any], Frozen]  # the typed estimate (raises InvalidPlanError)
    iteration_time: Callable[[Problem, Any], float]  # T only: the solvers' fast path
    iteration_flops: Callable[[ModelSpec, TrainingSpec], float]  # F_iter: the model FLOPs MFU counts
    unit: str  # the name of the plan's data-parallel units: "pipeline", "replica"
    units: Callable[[Any], Sequence[Any]]  # a plan's units, in plan order
    units_s: Callable[[Any], float]  # of an estimate: its slowest unit's time, DP sync left out
    outline: Callable[[Any], str]  # the plan's structure in one phrase: "D=2, 5 stages, 8 devices, TP 2/1/..."
    pipeline_schedule: bool  # whether its plans run a pipeline schedule (1F1B, GPipe)
    link_traffic: str  # what its runs send over the links (so what links refitted from them describe)
    # a run (docs/calibration.md §9): each step of a run log lists one timing per timed part of the
    # plan — a stage, a member — in its field `timings` ("stages", "members"), keyed by
    # `timing_key`; `timed_parts` are the plan's keys in order. `step_rows` turns one step's
    # timings into per-unit times per micro-batch, by RunRecord field (stage_s, tp_s, ...)
    timings: str
    timing_key: Callable[[Any], tuple[int, ...]]
    timed_parts: Callable[[Any], list[tuple[int, ...]]]
    step_rows: Callable[[Problem, Any, Sequence[Any]], dict[str, list[float]]]  # (problem, plan, timings)
    # calibration: a run record's measured collective rows, and the cost model's figures for
    # a run record's rows: [each unit's time, T, then each collective row]
    measured_collectives: Callable[[Any], tuple[CollectiveRow, ...]]  # (RunRecord) -> rows
    predicted_rows: Callable[[Problem, Any, tuple[CollectiveRow, ...]], np.ndarray]
    # why no plan of this kind can exist for a problem (a rule no choice of devices meets, e.g. a
    # sequence that no ring of groups can split), or None: every solver of the kind answers
    # infeasible with it, so that `solve --kind auto` goes on with the other kinds
    impossible: Callable[[Problem], str | None] = lambda problem: None
