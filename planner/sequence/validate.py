"""The validator of sequence plans: every violation of docs/sequence-plans.md §7.1, each with its numbers."""

from __future__ import annotations

import numpy as np

from planner.base import GIB
from planner.problem import Problem
from planner.sequence.plan import SeqPlan
from planner.sequence.pricing import memory_parts
from planner.sequence.rules import location, devices_exist, structural_violations
from planner.sequence.table import MemberTable
from planner.violations import Violation


def memory_violations(problem: Problem, table: MemberTable) -> list[Violation]:
    """Rule 5: the memory of §7.3 fits on every used device."""
    mem = memory_parts(problem, table)
    out = []
    for i in np.flatnonzero(mem.total > mem.capacity).tolist():
        gpu = problem.cluster.gpu_of(int(problem.cluster.machine_of_device[table.device[i]]))
        out.append(Violation(rule="memory", message=(
            f"{location(table, int(table.group[i]), i)}: needs {mem.total[i] / GIB:.2f} GiB, {gpu.name} has "
            f"{mem.capacity[i] / GIB:.2f} GiB ({(mem.total[i] - mem.capacity[i]) / GIB:.2f} GiB over; "
            f"{int(table.tokens[i])} tokens, {int(table.heads[i])} heads)")))
    return out


def validate(problem: Problem, plan: SeqPlan | MemberTable) -> list[Violation]:
    """Every violation of docs/sequence-plans.md §7.1 (an empty list means the plan is valid)."""
    table = plan if isinstance(plan, MemberTable) else MemberTable.of(plan)
    out = structural_violations(problem, table)
    if devices_exist(problem, table):  # memory needs real devices
        out += memory_violations(problem, table)
    return out
