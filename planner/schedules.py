"""Pipeline schedules as a registry of pure functions (docs/cost-model.md §3.3, §3.5).

A schedule says, for stage k of a pipeline of S stages running m micro-batches, the order
in which that stage runs its forward and backward passes, and how many micro-batches'
activations it holds at once (q of §3.5). The runtime executes the actions; the cost model
prices the memory with the same schedule's `in_flight`; the training setting `schedule`
picks the entry. Time is priced by the §3.3 formula under either schedule.

Like Megatron's `get_forward_backward_func`: the schedule is looked up by name, never
chosen by a string branch inside the executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np


class Pass(str, Enum):
    forward = "forward"
    backward = "backward"


@dataclass(frozen=True)
class Action:
    """One pass of one micro-batch on one stage."""

    pass_: Pass
    micro_batch: int


def _forwards(micro_batches) -> list[Action]:
    return [Action(Pass.forward, i) for i in micro_batches]


def _backwards(micro_batches) -> list[Action]:
    return [Action(Pass.backward, i) for i in micro_batches]


def one_f_one_b_actions(num_stages: int, stage: int, micro_batches: int) -> list[Action]:
    """1F1B: S−k−1 warm-up forwards, then alternate forward/backward, then the cool-down
    backwards; stage k never holds more than min(S−k, m) micro-batches' activations."""
    warmup = min(num_stages - stage - 1, micro_batches)
    order = _forwards(range(warmup))
    for i in range(micro_batches - warmup):
        order += [Action(Pass.forward, warmup + i), Action(Pass.backward, i)]
    return order + _backwards(range(micro_batches - warmup, micro_batches))


def gpipe_actions(num_stages: int, stage: int, micro_batches: int) -> list[Action]:
    """GPipe: every forward, then every backward; all m micro-batches are in flight."""
    return _forwards(range(micro_batches)) + _backwards(range(micro_batches))


def one_f_one_b_in_flight(num_stages, index, micro_batches):
    """q = min(S − k, m_p) under 1F1B (element-wise on arrays)."""
    return np.minimum(num_stages - index, micro_batches)


def gpipe_in_flight(num_stages, index, micro_batches):
    """q = m_p under GPipe (element-wise on arrays)."""
    return np.broadcast_arrays(num_stages, index, micro_batches)[2]  # m_p, shaped like k


@dataclass(frozen=True)
class Schedule:
    name: str
    actions: Callable[[int, int, int], list[Action]]  # (S, k, m) -> this stage's order
    in_flight: Callable  # (S, k, m) -> q, element-wise


SCHEDULES: dict[str, Schedule] = {
    s.name: s for s in (
        Schedule("1f1b", one_f_one_b_actions, one_f_one_b_in_flight),
        Schedule("gpipe", gpipe_actions, gpipe_in_flight),
    )
}


def get_schedule(name: str) -> Schedule:
    if name not in SCHEDULES:
        raise KeyError(f"unknown schedule {name!r}; available: {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def max_in_flight(actions: list[Action]) -> int:
    """The most micro-batches whose forward ran and whose backward has not: what a stage
    running `actions` holds at once (the property `in_flight` states, checked by tests)."""
    live = peak = 0
    for a in actions:
        live += 1 if a.pass_ is Pass.forward else -1
        peak = max(peak, live)
    return peak
