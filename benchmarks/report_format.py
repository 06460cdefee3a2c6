"""Number formatting shared by the report's sections (a missing value is "—")."""

from __future__ import annotations

import statistics


def number(x, spec=".3g", none="—") -> str:
    return none if x is None else format(x, spec)


def mean_text(xs, spec=".2f") -> str:
    return format(statistics.mean(xs), spec) if xs else "—"


def times_text(a, b) -> str:
    """a / b as a factor, "—" when either is missing."""
    return "—" if a is None or b is None else f"{a / b:.2f}×"


def size_text(s: int) -> str:
    """A token count as 64K or 1M."""
    return f"{s // 1048576}M" if s >= 1048576 else f"{s // 1024}K"
