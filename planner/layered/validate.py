"""The validator of layered plans: every violation of docs/plan-space.md §2, each with its numbers."""

from __future__ import annotations

from planner.base import GIB
from planner.layered.plan import Plan
from planner.layered.pricing import stage_memory
from planner.layered.rules import structural_violations
from planner.layered.table import stage_table
from planner.problem import Problem
from planner.violations import Violation
from planner.base import plural


def memory_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rule 5: W + Act + R ≤ capacity on every used device (docs/cost-model.md §3.5)."""
    table = stage_table(problem, plan)
    need = stage_memory(problem, table)
    cap = problem.cluster.machine_memory_bytes[table.machine]
    out = []
    for i in (need > cap).nonzero()[0]:
        gpu = problem.cluster.gpu_of(int(table.machine[i]))
        out.append(Violation(
            rule="memory", pipeline=int(table.pipe[i]), stage=int(table.index[i]),
            message=f"needs {need[i] / GIB:.2f} GiB per device, {gpu.name} has {cap[i] / GIB:.2f} GiB "
                    f"({(need[i] - cap[i]) / GIB:.2f} GiB over; t={table.tp[i]}, {plural(table.layers[i], 'layer')})"))
    return out


def validate(problem: Problem, plan: Plan) -> list[Violation]:
    """Every violation of docs/plan-space.md §2 (an empty list means the plan is valid)."""
    out = structural_violations(problem, plan)
    if not any(v.rule == "device" and v.stage is not None for v in out):  # memory needs real devices
        out += memory_violations(problem, plan)
    return out
