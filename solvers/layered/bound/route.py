"""The usage route of the configuration bound (docs/bounds.md §6, [U5]): which classes its tables
are built over for the time and memory left, which D get their own tables, and the tables
themselves (`UsageRoute`), with [U16]'s cases beside them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from solvers.layered.bound.classes import ClassTypes, class_types
from solvers.layered.bound.fewest_stages import FewestStagesCases
from solvers.layered.bound.pricing import breakpoints
from solvers.layered.bound.usage import UsageTable, route_tables, usage_size, usage_tables
from solvers.layered.tables import Tables

# measured: a usage table's DP costs 2.4–4.4e-10 s per (b, ℓ, u, type, n) on a shared core since it skips the
# breakpoints a layer count does not fit (4–6e-10 before; benchmarks/bench_usage_tables.py); kept above both,
# since a busier machine is slower and an estimate too low lets the tables take the LP route's time
SECONDS_PER_CELL = 7e-10
TABLE_SHARE = 0.5  # of the time left, the most the usage tables may take (estimated)
PENDING_TABLES = 4  # own tables the second pass is expected to build (memory estimate)
OWN_AROUND = 2  # the first pass also builds the own tables of the D this close to the incumbent's
# (closing a table costs a tenth of its prefix; on hetero-1 the D the bare table left were 5 and 6
# around the incumbent's 4, and a second pass costs a whole prefix again)
CLOSE_SHARE = 0.1  # an own table's last stage and crossing part, as a share of the prefix's time
MAX_TABLE_BYTES = 2.0e9  # every route table together (float32); 1.5e9 left hetero-2 13B's crossing parts out
# (17 tables of 93 MB: 1.59 GB); the bounds report's process then peaked at 3.3 GB resident


def prefix_seconds(tables: Tables, types: ClassTypes, b: np.ndarray) -> float:
    """The estimated time of one prefix table (breakpoints × (L + 1) × usage cells × types × L/2 DP steps)."""
    return SECONDS_PER_CELL * len(b) * (tables.layers + 1) * usage_size(types) * types.num_types * tables.layers / 2


@dataclass
class UsageRoute:
    """Every D's class-level types and usage tables: its own where built, else the bare table
    its caps group shares (`usage.usage_tables`); `used[d]` is the one its test reads."""

    types: dict[int, ClassTypes]
    b: np.ndarray
    bare: dict[int, UsageTable]
    own: dict[int, UsageTable] = field(default_factory=dict)
    used: dict[int, UsageTable] = field(default_factory=dict)
    crossing: bool = True  # own tables carry their crossing part ([U9]; off where the memory would not fit)
    fewest: FewestStagesCases | None = None  # [U16]'s cases, where the route's test leaves a threshold open

    def __post_init__(self) -> None:
        self.used.update(self.bare)
        self.used.update(self.own)

    def bare_for(self, d: int) -> UsageTable | None:
        """A bare table (no sync floor) valid for D: one built for a D of the same memory caps."""
        caps = self.types[d].caps.tobytes()
        return next((t for e, t in self.bare.items() if self.types[e].caps.tobytes() == caps), None)

    def build(self, ds: list[int], deadline: float) -> None:
        """Own tables for `ds` (none when the deadline passes first)."""
        built = usage_tables({d: self.types[d] for d in ds}, self.b, deadline, crossing=self.crossing)
        if built is not None:
            self.own.update(built)
            self.used.update(built)


def _route_classes(tables: Tables, d_values: list[int], top: float, seconds: float, near: set[int]):
    """(classes per D, breakpoints, the D with own tables, whether those carry their crossing
    part) of the finest classes whose usage tables' first pass fits `seconds` and the memory cap
    (identical machines, else machines with the same GPU); None when neither does (the second
    pass is optional). Every D gets its own table where that fits with the crossing parts (a
    bare table left hetero-2 7B's D = 7 and 8 at 10.12 and 10.01 s, their own at 10.47 and
    10.43); else the D in `near`."""
    for by_gpu in (False, True):
        any_types = class_types(tables, d_values[0], by_gpu)
        b = breakpoints(any_types, top)
        prefix_s = prefix_seconds(tables, any_types, b)
        table_bytes = 4.0 * len(b) * usage_size(any_types)
        if prefix_s > seconds * TABLE_SHARE or table_bytes > MAX_TABLE_BYTES:
            continue  # not one table fits: every D's classes are not built (1,024 D took 58 s of a 5 s solve)
        by_d = {d: class_types(tables, d, by_gpu) for d in d_values}
        bare = len({t.caps.tobytes() for t in by_d.values()})

        def fits(own, pending: int, crossing: bool) -> bool:
            """Whether a first pass with these own tables fits the time and, with `pending`
            tables of a second pass, the memory (the own ones twice with crossing parts)."""
            extra_s = prefix_s * CLOSE_SHARE * len(set(own) - near)  # closings beyond the near D's
            tables_kept = bare + (len(own) + pending) * (2 if crossing else 1)
            return prefix_s + extra_s <= seconds * TABLE_SHARE and table_bytes * tables_kept <= MAX_TABLE_BYTES

        if fits(d_values, 0, True):
            return by_d, b, set(d_values), True, by_gpu
        if fits(near, PENDING_TABLES, False):
            # own tables carry their crossing part ([U9]) where the memory allows: never a coarser route for it
            return by_d, b, near, fits(near, PENDING_TABLES, True), by_gpu
    return None


def usage_route_fits(tables: Tables, incumbent: float | None, seconds: float) -> bool:
    """Whether `configuration_bound` given `seconds` would take the usage route (not the LP's)."""
    top = incumbent if incumbent is not None else 2 * tables.trivial_bound
    return _route_classes(tables, list(range(1, tables.max_pipelines + 1)), top, seconds, set()) is not None


def _usage_route(tables: Tables, d_values: list[int], top: float, deadline: float, log,
                 first_d: int | None) -> UsageRoute | None:
    """The bare table of every D and the own tables of every D, or of the D around `first_d`
    (one pass), on the classes `_route_classes` picks for the time left; None when none fits."""
    near = set(range(first_d - OWN_AROUND, first_d + OWN_AROUND + 1)) & set(d_values) if first_d else set()
    chosen = _route_classes(tables, d_values, top, deadline - time.perf_counter(), near)
    if chosen is None:
        log("configuration bound: usage tables too large, LP certificate over ranges of D")
        return None
    by_d, b, own, crossing, by_gpu = chosen
    if not len(b):  # no stage time up to `top` (float noise at one micro-batch, one stage): no table
        log("configuration bound: no breakpoints for usage tables, LP certificate over ranges of D")
        return None
    log(f"configuration bound: usage tables over classes {by_d[d_values[0]].devices.tolist()}, {len(b)} breakpoints, "
        + ("every D's own" if len(own) == len(d_values) else f"own for D={sorted(own)}")
        + ("" if crossing else " (no crossing parts: memory)"))
    built = route_tables(by_d, b, deadline, own, crossing)
    if built is None:
        return None
    fewest = FewestStagesCases(tables, by_gpu, b, by_d, own, crossing, deadline=deadline,
                               prefix_s=prefix_seconds(tables, by_d[d_values[0]], b))
    return UsageRoute(types=by_d, b=b, bare=built[0], own=built[1], crossing=crossing, fewest=fewest)
