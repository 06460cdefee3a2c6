"""Sequence plans (docs/sequence-plans.md §7, after HexiSeq): data-parallel replicas, each a ring of
context-parallel groups, each group head-parallel members with uneven heads and tokens.
Modules from the bottom up: `plan` (types) → `table` (plan as member/group/replica arrays) →
`rules` (rules 1–4) → `cost` (every §7.2–§7.3 formula) and `links` (bandwidths between
devices) → `pricing` (every term, numpy over members) → `validate` (rules 1–5) → `evaluate`
(typed `SeqEstimate`, bottleneck).

For solvers: build plans with `SeqPlan.from_rings`, or price arrays without a plan through
`MemberTable.from_arrays` and `iteration_time(problem, table, check=False)`."""

from operator import attrgetter

from planner.cost import iteration_flops  # F_iter: the same count as the layered kind's
from planner.plan_kind import PlanKind
from planner.sequence import calibration
from planner.sequence.estimate import Bottleneck, GroupEstimate, MemberEstimate, ReplicaEstimate, SeqEstimate
from planner.sequence.evaluate import evaluate
from planner.sequence.plan import SEQPLAN_FORMAT, Group, Member, Replica, SeqPlan, outline
from planner.sequence.rules import no_token_layout
from planner.sequence.pricing import iteration_time
from planner.sequence.table import MemberTable
from planner.sequence.validate import validate

KIND = PlanKind(name="sequence", format=SEQPLAN_FORMAT, schema_name="seqplan", plan_type=SeqPlan, validate=validate,
                evaluate=evaluate, iteration_time=iteration_time, iteration_flops=iteration_flops,
                unit="replica", units=attrgetter("replicas"), units_s=attrgetter("replica_s"), outline=outline,
                pipeline_schedule=False, link_traffic="all-to-alls and ZeRO-3 collectives",
                timings="members", timing_key=attrgetter("replica", "group", "member"), timed_parts=calibration.timed_parts,
                step_rows=calibration.step_rows, measured_collectives=calibration.measured_collectives,
                predicted_rows=calibration.predicted_rows, impossible=no_token_layout)

__all__ = ["KIND", "SEQPLAN_FORMAT", "Bottleneck", "Group", "GroupEstimate", "Member", "MemberEstimate",
           "MemberTable", "Replica", "ReplicaEstimate", "SeqEstimate", "SeqPlan", "evaluate",
           "iteration_time", "validate"]
