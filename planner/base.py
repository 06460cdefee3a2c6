"""The bottom of the planner: units and the frozen base type that every typed value uses."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

GB = 1e9  # bandwidth unit: GB/s = 1e9 bytes/s
GIB = 2**30  # memory unit
TFLOPS = 1e12
US = 1e-6  # latencies are written in microseconds


def plural(count, word: str) -> str:
    """'1 stage', '3 stages', '1,024 devices': a count with its noun in the right number."""
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def format_seconds(x: float, digits: int = 4) -> str:
    """A time in the unit that shows its digits: 22.57 s, 1.724 ms, 11.43 µs (messages and
    tables alike, so one output never mixes 1.1e-05 s with ms)."""
    unit, div = ("s", 1.0) if abs(x) >= 1 or x == 0 else ("ms", 1e-3) if abs(x) >= 1e-3 else ("µs", 1e-6)
    return f"{x / div:.{digits}g} {unit}"


def format_runs(values) -> str:
    """[0, 1, 2, 3, 8] → "0-3,8": runs of consecutive integers collapsed (device ids, D values)."""
    runs, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            runs.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ",".join(runs)


class Frozen(BaseModel):
    """Base of every input type: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")
