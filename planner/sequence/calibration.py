"""What a run of a sequence plan measures, and the cost model's figures for it (DESIGN.md §9,
`planner.calibration_runs`): each replica's T_mb (its slowest member's forward + backward per
micro-batch, §7.2), then T, then the HP all-to-all and ZeRO-3 parts of each replica's T_mb
that the run timed."""

from __future__ import annotations

import numpy as np

from planner.problem import Problem
from planner.sequence.plan import SeqPlan
from planner.sequence.pricing import time_parts
from planner.sequence.table import MemberTable


def measured_collectives(record) -> tuple[tuple[str, int], ...]:
    """("hp", replica) and ("zero", replica) of each replica that spent time in its HP
    all-to-alls and in its ZeRO-3 collectives, as the record measured them."""
    return (tuple(("hp", r) for r, seconds in enumerate(record.hp_s) if seconds > 0)
            + tuple(("zero", r) for r, seconds in enumerate(record.zero_s) if seconds > 0))


def predicted_rows(problem: Problem, plan: SeqPlan, collectives: tuple[tuple[str, int], ...] = ()) -> np.ndarray:
    """[T_mb of each replica, then T, then each of `collectives`: a replica's HP or ZeRO-3
    part of T_mb] (§7.2)."""
    parts = time_parts(problem, MemberTable.of(plan))
    terms = {"hp": parts.hp_micro, "zero": parts.zero_micro}
    return np.concatenate([parts.micro_batch, [parts.iteration], [terms[k][i] for k, i in collectives]])
