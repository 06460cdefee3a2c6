"""The configuration bound over every D (docs/bounds.md §4): per D, the largest threshold
the certificate refutes, found by bisection; the bound is the least over D.

A D is only bisected when it could lower the bound found so far: it is first tested at the
current least (refuted there: it cannot lower it). Thresholds are tested from the incumbent
down, so a D refuted at the incumbent is proved not to beat it at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from solvers.layered.bound.classes import class_types
from solvers.layered.bound.master import Master
from solvers.layered.tables import Tables

RELATIVE_TOLERANCE = 2e-4  # bisection stops when the bracket is this narrow
FLOAT_SLACK = 1e-9  # relative: the bound is deflated by this against float noise (docs/bounds.md §5)


@dataclass
class DBound:
    """What is proved for one D: no plan with D pipelines has T ≤ `refuted` (0: nothing)."""

    pipelines: int
    refuted: float = 0.0
    done: bool = False  # the bisection finished (or the D cannot lower the bound)


@dataclass
class ConfigurationBound:
    """The configuration bound of a problem: per D what is refuted, and the bound over all."""

    per_d: dict[int, DBound] = field(default_factory=dict)
    floor: float = 0.0  # a bound every plan satisfies (the trivial one), used where a D is open
    complete: bool = False  # every D was examined

    @property
    def value(self) -> float:
        """min over D of what is refuted there (never below the floor), deflated by FLOAT_SLACK."""
        if not self.per_d:
            return self.floor
        least = min(max(d.refuted, self.floor) for d in self.per_d.values())
        return least * (1 - FLOAT_SLACK)


def configuration_bound(tables: Tables, incumbent: float | None, d_values: list[int], deadline: float,
                        log=lambda s: None) -> ConfigurationBound:
    """The bound over `d_values` (each D's relaxation is valid for its plans only), with the
    incumbent as the first threshold (None: the bisection starts from twice the trivial bound)."""
    floor = tables.trivial_bound
    result = ConfigurationBound(per_d={d: DBound(d, floor) for d in d_values}, floor=floor)
    top = incumbent if incumbent is not None else 2 * floor
    for d in d_values:
        if time.perf_counter() > deadline:
            log(f"configuration bound: time limit before D={d}")
            return result
        master = Master(class_types(tables, d))
        entry = result.per_d[d]
        current = min(max(e.refuted, floor) for e in result.per_d.values() if e.done) if any(
            e.done for e in result.per_d.values()) else top
        _bisect(master, entry, floor, min(top, current), deadline)
        log(f"configuration bound D={d}: no plan with T ≤ {entry.refuted:.6g} s" + ("" if entry.done else " (open)"))
    result.complete = all(e.done for e in result.per_d.values())
    return result


def _bisect(master: Master, entry: DBound, floor: float, top: float, deadline: float) -> None:
    """Raise entry.refuted from `floor` towards `top`: first `top` itself, then bisection."""
    if master.refuted(top):
        entry.refuted, entry.done = top, True
        return
    lo, hi = max(floor, entry.refuted), top
    while hi - lo > RELATIVE_TOLERANCE * hi:
        if time.perf_counter() > deadline:
            return
        mid = 0.5 * (lo + hi)
        if master.refuted(mid):
            lo = mid
        else:
            hi = mid
    entry.refuted, entry.done = lo, True
