"""What a plan too large to read row by row prints instead: its units (pipelines, replicas)
grouped by shape with counts, the devices used and idle per GPU type, and the bottleneck.

Both plan kinds' views build their summary from these pieces; `--full` prints every row, and
`--json` is always complete. A summary never grows with the cluster: at most MAX_SHAPE_ROWS
shapes are listed, and the rest is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from rich import box
from rich.table import Table

from planner.problem import Problem

SUMMARY_ABOVE_UNITS = 64  # pipelines or replicas
SUMMARY_ABOVE_PARTS = 256  # stages or groups
MAX_SHAPE_ROWS = 24
MAX_IDLE_ROWS = 8  # idle machines listed one by one


def is_large(units: int, parts: int) -> bool:
    """Whether a plan of `units` pipelines (replicas) and `parts` stages (groups) prints as a summary."""
    return units > SUMMARY_ABOVE_UNITS or parts > SUMMARY_ABOVE_PARTS


def plural(count: int, word: str) -> str:
    """'1 stage', '3 stages' (and 'pipeline'/'replica' alike)."""
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def shape_table(title: str, columns: Sequence[str], shapes: Sequence[tuple[Hashable, Sequence[str]]]) -> Table:
    """One row per distinct shape with its count, most frequent first: `shapes` holds each
    unit's (key, cells); units with equal keys share a row (the first one's cells)."""
    counts = Counter(key for key, _ in shapes)
    cells = {}
    for key, row in shapes:
        cells.setdefault(key, row)
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("count", *columns):
        table.add_column(col, justify="right" if col == "count" else "left")
    ranked = sorted(counts, key=lambda k: -counts[k])
    for key in ranked[:MAX_SHAPE_ROWS]:
        table.add_row(f"{counts[key]:,}", *cells[key])
    if len(ranked) > MAX_SHAPE_ROWS:
        rest = sum(counts[k] for k in ranked[MAX_SHAPE_ROWS:])
        table.add_row(f"{rest:,}", f"… in {len(ranked) - MAX_SHAPE_ROWS:,} more shapes (--full or --json lists them)")
    return table


def device_use_table(problem: Problem, used: Sequence[int]) -> Table:
    """Per GPU type: devices in the cluster, used by the plan, idle."""
    cluster, taken = problem.cluster, set(used)
    total: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    for m, machine in enumerate(cluster.machines):
        devices = cluster.devices_of(m)
        total[machine.gpu] += len(devices)
        busy[machine.gpu] += sum(d in taken for d in devices)
    table = Table(title=f"devices: {len(taken):,} of {cluster.num_devices:,} used", box=box.SIMPLE_HEAD,
                  header_style="bold", title_justify="left")
    for col in ("GPU type", "devices", "used", "idle"):
        table.add_column(col, justify="left" if col == "GPU type" else "right")
    for gpu in sorted(total, key=lambda g: -total[g]):
        table.add_row(gpu, f"{total[gpu]:,}", f"{busy[gpu]:,}", f"{total[gpu] - busy[gpu]:,}")
    return table


def idle_machine_rows(problem: Problem, used: Sequence[int]) -> tuple[list[tuple[str, list[int]]], int]:
    """The first MAX_IDLE_ROWS machines with idle devices (name, idle devices), and how many more there are."""
    cluster, taken = problem.cluster, set(used)
    idle = []
    for m, machine in enumerate(cluster.machines):
        devices = [d for d in cluster.devices_of(m) if d not in taken]
        if devices:
            idle.append((machine.name, devices))
    return idle[:MAX_IDLE_ROWS], max(0, len(idle) - MAX_IDLE_ROWS)
