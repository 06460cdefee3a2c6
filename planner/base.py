"""The bottom of the planner: units and the frozen base type that every typed value uses."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

GB = 1e9  # bandwidth unit: GB/s = 1e9 bytes/s
GIB = 2**30  # memory unit
TFLOPS = 1e12
US = 1e-6  # latencies are written in microseconds


class Frozen(BaseModel):
    """Base of every input type: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")
