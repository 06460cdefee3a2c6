"""The validator: every violation of DESIGN.md §2, each with its numbers."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import Field

from planner.hardware import GIB, Frozen
from planner.plan import Plan
from planner.problem import Problem

Rule = Literal["device", "machine", "tp_size", "layers", "batch", "memory"]


class Violation(Frozen):
    rule: Rule = Field(description="which rule of DESIGN.md §2 is broken")
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


def _device_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rule 1 (each device in at most one stage) and device ids that do not exist."""
    n = problem.cluster.num_devices
    out, seen = [], Counter(plan.devices)
    for p, pipe in enumerate(plan.pipelines):
        for k, stage in enumerate(pipe.stages):
            missing = [d for d in stage.devices if d >= n]
            if missing:
                out.append(Violation(rule="device", pipeline=p, stage=k,
                                     message=f"devices {missing} do not exist (cluster has {n}: 0..{n - 1})"))
    for d, count in sorted(seen.items()):
        if count > 1:
            out.append(Violation(rule="device", message=f"device {d} is used by {count} stages"))
    return out


def _stage_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rule 2: one machine per stage; t a power of two dividing a and k."""
    cluster, model = problem.cluster, problem.model
    out = []
    for p, pipe in enumerate(plan.pipelines):
        for k, stage in enumerate(pipe.stages):
            known = [d for d in stage.devices if d < cluster.num_devices]
            machines = sorted({cluster.machines[cluster.machine_of_device[d]].name for d in known})
            if len(machines) > 1:
                out.append(Violation(rule="machine", pipeline=p, stage=k,
                                     message=f"devices {list(stage.devices)} span machines {machines}"))
            t = stage.tp
            if t & (t - 1):
                out.append(Violation(rule="tp_size", pipeline=p, stage=k,
                                     message=f"TP size {t} is not a power of two"))
            elif model.heads % t or model.num_kv_heads % t:
                out.append(Violation(rule="tp_size", pipeline=p, stage=k,
                                     message=f"TP size {t} does not divide heads {model.heads} "
                                             f"and kv heads {model.num_kv_heads}"))
    return out


def _layer_and_batch_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rules 3 (Σ n = L per pipeline) and 4 (B_p a multiple of b, Σ B_p = B)."""
    big_l, b = problem.model.layers, problem.training.micro_batch
    out = []
    for p, pipe in enumerate(plan.pipelines):
        if pipe.layers != big_l:
            out.append(Violation(rule="layers", pipeline=p,
                                 message=f"stages hold {pipe.layers} layers, the model has {big_l}"))
        if pipe.batch % b:
            out.append(Violation(rule="batch", pipeline=p,
                                 message=f"batch {pipe.batch} is not a multiple of micro-batch {b}"))
    total = sum(p.batch for p in plan.pipelines)
    if total != problem.training.global_batch:
        out.append(Violation(rule="batch", message=f"pipeline batches sum to {total}, "
                                                   f"the global batch is {problem.training.global_batch}"))
    return out


def structural_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rules 1–4: everything but memory."""
    return (_device_violations(problem, plan) + _stage_violations(problem, plan)
            + _layer_and_batch_violations(problem, plan))


def memory_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rule 5: W + Act + R ≤ capacity on every used device (DESIGN.md §3.5)."""
    from planner.evaluate import stage_memory
    from planner.table import stage_table

    table = stage_table(problem, plan)
    need = stage_memory(problem, table)
    cap = problem.cluster.machine_memory_bytes[table.machine]
    out = []
    for i in (need > cap).nonzero()[0]:
        gpu = problem.cluster.gpu_of(int(table.machine[i]))
        out.append(Violation(
            rule="memory", pipeline=int(table.pipe[i]), stage=int(table.index[i]),
            message=f"needs {need[i] / GIB:.2f} GiB per device, {gpu.name} has {cap[i] / GIB:.2f} GiB "
                    f"({(need[i] - cap[i]) / GIB:.2f} GiB over; t={table.tp[i]}, {table.layers[i]} layers)"))
    return out


def validate(problem: Problem, plan: Plan) -> list[Violation]:
    """Every violation of DESIGN.md §2 (an empty list means the plan is valid)."""
    out = structural_violations(problem, plan)
    if not any(v.rule == "device" and v.stage is not None for v in out):  # memory needs real devices
        out += memory_violations(problem, plan)
    return out
