"""The cross-vendor bridge in the terminal views (docs/vendors.md §8): how much of T crosses it, and
how many bytes an iteration sends over it. Shown only when the cluster mixes nvidia and amd."""

from __future__ import annotations

from rich import box
from rich.table import Table

from planner.base import format_seconds
from planner.bridge import BridgeTraffic
from planner.problem import Problem


def format_bytes(x: float) -> str:
    """Bytes in the decimal unit that shows its digits: 131.1 kB, 10.74 GB."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.4g} {unit}"
    return f"{x:.4g} B"


def bridge_line(problem: Problem, traffic: BridgeTraffic) -> str:
    """One line: bridge-bound seconds and share of T, bytes per iteration by kind, the bridge."""
    cluster = problem.cluster
    kinds = ", ".join(f"{kind} {format_bytes(value)}" for kind, value in traffic.bytes_by_kind.items())
    return (f"{format_seconds(traffic.bridge_s)} of T ({traffic.share:.1%}) in bridge-bound terms; "
            f"{format_bytes(traffic.bytes_per_step)} per iteration over the bridge ({kinds}); "
            f"bridge {cluster.cross_vendor_bw_gbps:g} GB/s, +{cluster.cross_vendor_latency_us:g} µs")


def bridge_table(problem: Problem, traffic: BridgeTraffic) -> Table:
    table = Table(title="cross-vendor traffic (nvidia ↔ amd bridge, docs/vendors.md §8)", show_header=False,
                  box=box.SIMPLE, title_justify="left")
    table.add_column()
    table.add_row(bridge_line(problem, traffic))
    return table
