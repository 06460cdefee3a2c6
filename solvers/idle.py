"""Why a plan leaves GPUs idle, for both plan kinds: per machine with idle devices, the best plan
found that also puts them to work (each kind's `explain_idle`: a layered plan's idle devices as
one more stage, a sequence plan's as more groups of one replica's ring), its T and what then
limits it. An idle GPU surprises an expert, so the answer is a number; it is an explanation,
not a search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import format_seconds

MAX_MACHINES = 6  # explain at most this many idle machines
TIME_BUDGET_S = 5.0  # no further machine is explained once this much time is spent


@dataclass(frozen=True)
class IdleMachine:
    machine: str
    devices: tuple[int, ...]  # its idle devices
    best_time_s: float | None  # T of the best plan found that uses them (None: none fits)
    why: str  # the bottleneck of that plan, or why nothing fits (and whether the search was cut)
    best_plan: Any  # that plan (of the plan's kind)
    added: str = "one more stage"  # how the idle devices joined the plan, in words

    def describe(self, current_s: float) -> str:
        head = f"{self.machine} ({len(self.devices)} idle)"
        if self.best_time_s is None:
            return f"{head}: {self.why}"
        slower = (self.best_time_s / current_s - 1) * 100
        return (f"{head}: with them as {self.added}, best {format_seconds(self.best_time_s)} vs "
                f"{format_seconds(current_s)} ({slower:+.1f} %): {self.why}")


def idle_devices(problem, plan) -> dict[int, tuple[int, ...]]:
    """Machine index → its devices that the plan (of either kind) does not use."""
    used, cluster = set(plan.devices), problem.cluster
    out = {}
    for m in range(len(cluster.machines)):
        idle = tuple(d for d in cluster.devices_of(m) if d not in used)
        if idle:
            out[m] = idle
    return out
