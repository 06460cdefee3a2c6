"""Timing a rank's step by phase (docs/calibration.md §9): forward, backward, stage-to-stage
communication, gradient sync and the whole step, as the run records them.

A `PhaseTimer` is made per step and passed explicitly (no module-level state), so any plan
kind's runtime can use it. On CUDA, kernels run asynchronously: a timer given the device's
`synchronize` waits for them at each phase boundary, so a phase's seconds are its own work.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

FORWARD, BACKWARD, COMM, SYNC, STEP = "forward", "backward", "comm", "sync", "step"
# Collectives inside forward and backward, timed by the communicator (`time_collectives`):
# a stage's TP all-reduces, all-gathers and (sequence parallelism) reduce-scatters; a sequence
# member's head-parallel all-to-alls and
# its ZeRO-3 all-gathers and reduce-scatters.
TP, HP, ZERO = "tp", "hp", "zero"
TP_KINDS = ("all_reduce", "all_gather", "reduce_scatter")  # reduce-scatter: sequence parallelism's
HP_KINDS, ZERO_KINDS = ("all_to_all",), ("all_gather", "reduce_scatter")
STAGE_PHASES = (FORWARD, BACKWARD, COMM, SYNC, TP)  # per stage in a run's metrics, in this order


@dataclass
class PhaseTimer:
    """Seconds spent in each named phase on this rank; phases may nest (a step holds a sync)."""

    synchronize: Callable[[], None] | None = None
    totals: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.synchronize is not None:
            self.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def seconds(self, name: str) -> float:
        return self.totals.get(name, 0.0)


def device_synchronizer(device) -> Callable[[], None] | None:
    """`torch.cuda.synchronize` bound to a CUDA device; None on CPU (nothing to wait for)."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch  # only on CUDA

    return lambda: torch.cuda.synchronize(device)
