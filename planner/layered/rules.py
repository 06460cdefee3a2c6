"""Rules 1–4 of docs/plan-space.md §2 (everything but memory): what a layered plan must satisfy before
it can be priced. Below the pricing module, so that pricing can refuse an unsound plan."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from planner.layered.plan import Plan
from planner.problem import Problem
from planner.violations import Violation
from planner.base import plural


@dataclass(frozen=True)
class _FlatStages:
    """Every stage's devices in one array, so that rules 1–2 are checked with numpy and only
    the offending stages are visited in Python (the heuristic validates in its inner loop)."""

    where: list[tuple[int, int]]  # (pipeline, stage) of each stage
    devices: list[tuple[int, ...]]
    flat: np.ndarray  # all device ids, stage after stage
    starts: np.ndarray  # offset of each stage in `flat`
    sizes: np.ndarray  # t of each stage

    @classmethod
    def of(cls, plan: Plan) -> _FlatStages:
        where = [(p, k) for p, pipe in enumerate(plan.pipelines) for k in range(len(pipe.stages))]
        devices = [s.devices for pipe in plan.pipelines for s in pipe.stages]
        sizes = np.fromiter(map(len, devices), dtype=np.int64, count=len(devices))
        flat = np.fromiter(chain.from_iterable(devices), dtype=np.int64, count=int(sizes.sum()))
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return cls(where, devices, flat, starts, sizes)


def _device_violations(problem: Problem, stages: _FlatStages) -> list[Violation]:
    """Rule 1 (each device in at most one stage) and device ids that do not exist."""
    n = problem.cluster.num_devices
    out = []
    missing = np.maximum.reduceat(stages.flat, stages.starts) >= n
    for i in np.flatnonzero(missing).tolist():
        p, k = stages.where[i]
        gone = [d for d in stages.devices[i] if d >= n]
        out.append(Violation(rule="device", pipeline=p, stage=k,
                             message=f"devices {gone} do not exist (cluster has {n}: 0..{n - 1})"))
    ids, counts = np.unique(stages.flat, return_counts=True)
    for d, count in zip(ids[counts > 1].tolist(), counts[counts > 1].tolist()):
        out.append(Violation(rule="device", message=f"device {d} is used by {plural(count, 'stage')}"))
    return out


def _stage_violations(problem: Problem, stages: _FlatStages) -> list[Violation]:
    """Rule 2: one machine per stage; t a power of two dividing a and k. A machine has one GPU
    type, so one machine per stage is also §8's rule that no TP stage mixes vendors: a stage
    that spans machines of nvidia and amd devices says so in its message."""
    cluster, model = problem.cluster, problem.model
    n = cluster.num_devices
    known = stages.flat < n
    machine = cluster.machine_of_device[np.where(known, stages.flat, 0)]
    low = np.minimum.reduceat(np.where(known, machine, np.iinfo(np.int64).max), stages.starts)
    high = np.maximum.reduceat(np.where(known, machine, -1), stages.starts)
    t = stages.sizes
    spread = (high >= 0) & (low != high)
    not_pow2 = (t & (t - 1)) != 0
    not_dividing = ~not_pow2 & (((model.heads % t) != 0) | ((model.num_kv_heads % t) != 0))
    out = []
    for i in np.flatnonzero(spread | not_pow2 | not_dividing).tolist():
        p, k = stages.where[i]
        if spread[i]:
            names = sorted({cluster.machines[cluster.machine_of_device[d]].name
                            for d in stages.devices[i] if d < n})
            out.append(Violation(rule="machine", pipeline=p, stage=k,
                                 message=f"devices {list(stages.devices[i])} span machines {names}"
                                         + _vendor_note(cluster, stages.devices[i])))
        if not_pow2[i]:
            out.append(Violation(rule="tp_size", pipeline=p, stage=k,
                                 message=f"TP size {t[i]} is not a power of two"))
        elif not_dividing[i]:
            out.append(Violation(rule="tp_size", pipeline=p, stage=k,
                                 message=f"TP size {t[i]} does not divide {_undivided(model, int(t[i]))}"))
    return out


def _undivided(model, t: int) -> str:
    """"kv heads 2": the head counts TP size t does not divide, only those (a message that
    also named heads 4 for t = 4 would blame a count that fits)."""
    return " and ".join(f"{what} {size}" for what, size in (("heads", model.heads), ("kv heads", model.num_kv_heads))
                        if size % t)


def _vendor_note(cluster, devices) -> str:
    """' and mixes nvidia and amd devices (...)' when a stage's devices span both vendors, else ''."""
    vendors = {cluster.gpu_of(int(cluster.machine_of_device[d])).vendor.value
               for d in devices if d < cluster.num_devices}
    if {"nvidia", "amd"} <= vendors:
        return " and mixes nvidia and amd devices (no collective library spans two vendors)"
    return ""


def _layer_and_batch_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rules 3 (Σ n = L per pipeline) and 4 (B_p a multiple of b, Σ B_p = B)."""
    big_l, b = problem.model.layers, problem.training.micro_batch
    out = []
    for p, pipe in enumerate(plan.pipelines):
        if pipe.layers != big_l:
            out.append(Violation(rule="layers", pipeline=p,
                                 message=f"stages hold {plural(pipe.layers, 'layer')}, the model has {big_l}"))
        if pipe.batch % b:
            out.append(Violation(rule="batch", pipeline=p,
                                 message=f"batch {pipe.batch} is not a multiple of micro-batch {b}"))
    total = plan.global_batch
    if total != problem.training.global_batch:
        out.append(Violation(rule="batch", message=f"pipeline batches sum to {total}, "
                                                   f"the global batch is {problem.training.global_batch}"))
    return out


def structural_violations(problem: Problem, plan: Plan) -> list[Violation]:
    """Rules 1–4: everything but memory."""
    stages = _FlatStages.of(plan)
    return (_device_violations(problem, stages) + _stage_violations(problem, stages)
            + _layer_and_batch_violations(problem, plan))
