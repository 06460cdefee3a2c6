"""What a pipeline schedule's simulation reads of one pipeline (docs/cost-model.md §3.3):
each stage's forward and backward time and each hop's send time each way, per micro-batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PipelineTimes:
    """What the simulation reads of one pipeline of S stages, seconds per micro-batch."""

    forward: np.ndarray  # f_k, stage k's forward pass
    backward: np.ndarray  # b_k, its backward pass (with a recomputed forward, that too)
    send_forward: np.ndarray  # the activation's transfer k → k+1 (S − 1 hops)
    send_backward: np.ndarray  # the gradient's transfer k+1 → k

    def __post_init__(self):
        for name in ("forward", "backward", "send_forward", "send_backward"):
            values = np.asarray(getattr(self, name), dtype=float)
            if values.ndim != 1 or not np.all(np.isfinite(values)) or np.any(values < 0):
                raise ValueError(f"PipelineTimes.{name}: one non-negative finite time per stage or hop, got {values}")
            object.__setattr__(self, name, values)
        stages = len(self.forward)
        if stages < 1 or len(self.backward) != stages or len(self.send_forward) != stages - 1 \
                or len(self.send_backward) != stages - 1:
            raise ValueError(f"PipelineTimes: {stages} stages need {stages} forward and backward times and "
                             f"{max(stages - 1, 0)} send times each way")

    @property
    def stages(self) -> int:
        return len(self.forward)

    @classmethod
    def split(cls, tau, pp, forward_share) -> PipelineTimes:
        """From §3's per-stage τ_k and T_pp,k (the last stage's T_pp is 0, not a hop): stage k's
        forward is `forward_share`·τ_k (a scalar or one per stage), its backward the rest; each
        hop's T_pp (activation there, gradient back) is half each way."""
        tau, pp = np.asarray(tau, dtype=float), np.asarray(pp, dtype=float)
        forward = tau * forward_share
        return cls(forward, tau - forward, pp[:-1] / 2.0, pp[:-1] / 2.0)
