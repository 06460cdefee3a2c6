"""What a run of a sequence plan measures, and the cost model's figures for it (docs/calibration.md §9,
`planner.calibration_runs`): each replica's T_mb (its slowest member's forward + backward per
micro-batch, §7.2), then T, then the HP all-to-all and ZeRO-3 parts of each replica's T_mb
that the run timed. A run log times every member (its forward, backward, HP all-to-all and
ZeRO-3 seconds per step: `runtime.metrics.runlog`)."""

from __future__ import annotations

import numpy as np

from planner.problem import Problem
from planner.sequence.plan import SeqPlan
from planner.sequence.pricing import time_parts
from planner.sequence.table import MemberTable


def timed_parts(plan: SeqPlan) -> list[tuple[int, int, int]]:
    """(replica, group, member) of every member, in plan order: what a run log times."""
    return [(r, g, m) for r, rep in enumerate(plan.replicas) for g, group in enumerate(rep.ring)
            for m in range(len(group.members))]


def step_rows(problem: Problem, plan: SeqPlan, members) -> dict[str, list[float]]:
    """One step's member timings as, per replica and micro-batch: its slowest member's forward +
    backward (T_mb), the HP all-to-all time of its busiest member in an HP group (0 when no
    group has two members) and its busiest member's ZeRO-3 collective time. The busiest is
    the one with the most time outside those collectives: every collective is a barrier, so
    the busiest member's are transfers, the others' hold their waiting for it too."""
    counts = [rep.batch // problem.training.micro_batch for rep in plan.replicas]
    by_replica = [[m for m in members if m.replica == r] for r in range(len(plan.replicas))]
    in_groups = [[m for m in ms if m.hp_s > 0] for ms in by_replica]  # a member alone in its group sends none
    return {"stage_s": [max(m.forward_s + m.backward_s for m in ms) / n for ms, n in zip(by_replica, counts)],
            "hp_s": [_busiest(ms).hp_s / n if ms else 0.0 for ms, n in zip(in_groups, counts)],
            "zero_s": [_busiest(ms).zero_s / n for ms, n in zip(by_replica, counts)]}


def _busiest(members):
    """The member with the most time outside its HP and ZeRO-3 collectives."""
    return max(members, key=lambda m: m.forward_s + m.backward_s - m.hp_s - m.zero_s)


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
