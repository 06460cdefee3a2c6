"""What a plan too large to read row by row prints instead: its units (pipelines, replicas)
grouped by shape (what their parts are made of: stages by GPU type and TP size, groups by GPU
types and members) with counts and the range of their batches and times, the devices used and idle per GPU type, and the bottleneck.

Both plan kinds' views build their summary from these pieces; `--full` prints every row, and
`--json` is always complete. A summary never grows with the cluster: at most MAX_SHAPE_ROWS
shapes are listed, and the rest is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from rich import box
from rich.table import Table

from planner.base import format_seconds, plural  # noqa: F401 (plural: the views import it from here too)
from hexiscale.cli.views import plain
from planner.problem import Problem

SUMMARY_ABOVE_UNITS = 64  # pipelines or replicas
SUMMARY_ABOVE_PARTS = 256  # stages or groups
MAX_SHAPE_ROWS = 24


def is_large(units: int, parts: int) -> bool:
    """Whether a plan of `units` pipelines (replicas) and `parts` stages (groups) prints as a summary."""
    return units > SUMMARY_ABOVE_UNITS or parts > SUMMARY_ABOVE_PARTS


def shape_table(title: str, columns: Sequence[str], units: Sequence[tuple[Hashable, str, float, int]]) -> Table:
    """One row per distinct shape, most frequent first: `units` holds each unit's (key, its
    shape in words, its time, its batch); units with equal keys share a row that gives their
    count and the range of their batches and times."""
    groups: dict[Hashable, list[tuple[str, float, int]]] = {}
    for key, words, seconds, batch in units:
        groups.setdefault(key, []).append((words, seconds, batch))
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("count", *columns):
        table.add_column(col, justify="left" if col == columns[-1] else "right")
    ranked = sorted(groups, key=lambda k: -len(groups[k]))
    for key in ranked[:MAX_SHAPE_ROWS]:
        rows = groups[key]
        table.add_row(f"{len(rows):,}", _span([b for _, _, b in rows], str),
                      _span([t for _, t, _ in rows], format_seconds), plain(rows[0][0]))
    if len(ranked) > MAX_SHAPE_ROWS:
        rest = sum(len(groups[k]) for k in ranked[MAX_SHAPE_ROWS:])
        table.add_row(f"{rest:,}", "", "", f"… in {len(ranked) - MAX_SHAPE_ROWS:,} more shapes (--full or --json lists them)")
    return table


def _span(values, show) -> str:
    low, high = min(values), max(values)
    return show(low) if low == high else f"{show(low)}–{show(high)}"


def composition(parts: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """A unit's parts counted by kind, most first: ('A100-80G tp4', 13), ('H20 tp8', 9), …"""
    counts = Counter(parts)
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def composition_words(parts: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{n}× {what}" for what, n in parts)


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
        table.add_row(plain(gpu), f"{total[gpu]:,}", f"{busy[gpu]:,}", f"{total[gpu] - busy[gpu]:,}")
    return table
