"""Link sharing, measured on the emulated cluster (docs/testbed.md, docs/cost-model.md §3.4):
k = 1…4 concurrent TCP flows through one machine's shaped link, and the bandwidth each gets.

    .venv/bin/python benchmarks/bench_link_sharing.py [--mbit 400] [--seconds 3] [--repeats 3] [--out FILE]

Five machines of one cluster, every link shaped to the same rate (`--mbit`). Three patterns, all
through machine m0's link:
- fan-out: m0 sends to k machines at once (several pipelines' DP syncs or stage sends leaving
  one machine);
- fan-in: k machines send to m0 at once;
- one pair: k flows from m0 to m1 (k connections, e.g. k ranks' traffic between two machines).
Rates: each flow runs `--seconds`; its receiver counts the bytes after the first arrives; the
median over `--repeats` of each flow's rate, the flows' sum and the share each got. Transfers:
k transfers of `--mib` MiB each, started at once, until the last is done — what k equal DP
syncs through one NIC take. §3.4 prices every flow at its full link (what k = 1 gets); the last
column is that price's error. Rates are TCP payload: at most 1448/1514 = 95.6 % of the shaping.
Needs root (the testbed); prints one line and exits 1 where this host cannot.
Writes benchmarks/report/link_sharing.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from planner.hardware import Cluster, Machine  # noqa: E402
from runtime.testbed import Testbed, unavailable_reason  # noqa: E402
from runtime.testbed.layout import MBIT_PER_GBPS  # noqa: E402

SERVER = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); n, t0 = 0, None
    while (b := c.recv(1 << 20)):
        t0 = t0 or time.monotonic(); n += len(b)
    t1 = time.monotonic()
    print(n * 8 / (t1 - t0) / 1e6, t0, t1, flush=True)
""")
# argv: address, port, seconds (a flow that long) or, negative, megabytes to send (a transfer of that size)
CLIENT = textwrap.dedent("""
    import socket, sys, time
    s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); buf = b"x" * (1 << 20)
    limit = float(sys.argv[3]); end = time.monotonic() + limit; left = int(-limit)
    while (time.monotonic() < end) if limit > 0 else (left := left - 1) >= 0: s.sendall(buf)
    s.close()
""")
PATTERNS = ("fan-out", "fan-in", "one pair")
PORT = 5101
PAYLOAD_SHARE = 1448 / 1514
console = Console()


def five_machines() -> Cluster:
    return Cluster(name="link-sharing", inter_bw_gbps=1.25,
                   machines=[Machine(name=f"m{i}", gpu="RTX4090", count=1, intra_bw_gbps=16) for i in range(5)])


def flows(pattern: str, k: int) -> list[tuple[int, int]]:
    """(sender, receiver) machine of each of the k flows."""
    if pattern == "fan-out":
        return [(0, 1 + i) for i in range(k)]
    if pattern == "fan-in":
        return [(1 + i, 0) for i in range(k)]
    return [(0, 1)] * k


def run_flows(bed: Testbed, pairs: list[tuple[int, int]], limit: float) -> list[tuple[float, float, float]]:
    """Start every receiver, then every sender at once (`limit`: seconds per flow, or minus the
    MiB each sends); each receiver's (Mbit/s, first byte, last byte) in monotonic seconds."""
    python = sys.executable
    servers = [bed.start(b, [python, "-c", SERVER, str(PORT + i)], stdout=subprocess.PIPE, text=True)
               for i, (_, b) in enumerate(pairs)]
    for server in servers:
        assert server.stdout.readline().strip() == "ready"
    clients = [bed.start(a, [python, "-c", CLIENT, bed.address(b), str(PORT + i), str(limit)])
               for i, (a, b) in enumerate(pairs)]
    for client in clients:
        client.wait(timeout=abs(limit) + 120)
    return [tuple(float(x) for x in server.communicate(timeout=60)[0].split()) for server in servers]


def measure(bed: Testbed, seconds: float, mib: int, repeats: int) -> list[dict]:
    """Per pattern and k: each flow's rate over `seconds` (median over repetitions, flows sorted),
    and the time k transfers of `mib` MiB each take until the last one is done."""
    rows = []
    for pattern in PATTERNS:
        for k in range(1, 5):
            runs = [sorted(rate for rate, _, _ in run_flows(bed, flows(pattern, k), seconds)) for _ in range(repeats)]
            per_flow = [statistics.median(r[i] for r in runs) for i in range(k)]
            done = []
            for _ in range(repeats):
                ends = run_flows(bed, flows(pattern, k), -mib)
                done.append(max(e for _, _, e in ends) - min(s for _, s, _ in ends))
            rows.append({"pattern": pattern, "k": k, "per_flow_mbit": per_flow, "sum_mbit": sum(per_flow),
                         "runs": runs, "transfers_s": statistics.median(done), "transfer_runs_s": done})
            console.print(f"  {pattern} k={k}: " + ", ".join(f"{x:.0f}" for x in per_flow) + " Mbit/s; "
                          f"{k} × {mib} MiB done in {statistics.median(done):.2f} s", highlight=False)
    return rows


COLUMNS = ("pattern", "k", "each flow, Mbit/s", "sum", "per flow, share of the link", "k transfers done, s",
           "÷ one transfer's", "§3.4's time error")


def cells(rows: list[dict], r: dict, link_mbit: float) -> list[str]:
    """A row's cells: §3.4 prices each of the k transfers at the whole link, as if alone: the
    last column is how much longer the k transfers took than that price (one transfer's time)."""
    one = next(x for x in rows if x["pattern"] == r["pattern"] and x["k"] == 1)["transfers_s"]
    mean = statistics.fmean(r["per_flow_mbit"])
    return [r["pattern"], str(r["k"]), ", ".join(f"{x:.0f}" for x in r["per_flow_mbit"]), f"{r['sum_mbit']:.0f}",
            f"{mean / link_mbit:.1%}", f"{r['transfers_s']:.2f}", f"{r['transfers_s'] / one:.2f}",
            f"{r['transfers_s'] / one - 1:+.0%}"]


def table(rows: list[dict], link_mbit: float, mib: int) -> Table:
    out = Table(title=f"k concurrent TCP flows through one machine's link shaped to {link_mbit:.0f} Mbit/s "
                      f"(median of the repetitions; transfers of {mib} MiB each)")
    for column in COLUMNS:
        out.add_column(column, justify="right")
    for r in rows:
        out.add_row(*cells(rows, r, link_mbit))
    return out


def markdown(rows: list[dict], link_mbit: float, args) -> str:
    lines = ["# Link sharing on the emulated cluster\n",
             f"`benchmarks/bench_link_sharing.py`: k concurrent TCP flows through machine m0's link, shaped to "
             f"{link_mbit:.0f} Mbit/s on both ends (htb, docs/testbed.md). Rates: each flow runs {args.seconds:g} s, "
             f"the median over {args.repeats} repetitions per flow (flows sorted slowest first). Transfers: k "
             f"transfers of {args.mib} MiB each started at once, from the first byte to the last transfer's end, "
             f"median of {args.repeats}. docs/cost-model.md §3.4 prices each at the whole link, as k = 1 gets "
             f"it: the last column is that price's error.\n",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(rows, r, link_mbit)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbit", type=float, default=400.0, help="every link's shaped rate")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--mib", type=int, default=24, help="MiB each of the k transfers sends")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "report" / "link_sharing.json")
    args = parser.parse_args()
    if (reason := unavailable_reason()) is not None:
        console.print(f"error: {reason}", highlight=False)
        sys.exit(1)
    cluster = five_machines()
    scale = args.mbit / (cluster.inter_bw_gbps * MBIT_PER_GBPS)
    start = time.monotonic()
    with Testbed(cluster, scale=scale) as bed:
        rows = measure(bed, args.seconds, args.mib, args.repeats)
    console.print(table(rows, args.mbit, args.mib))
    console.print(f"{time.monotonic() - start:.0f} s", highlight=False)
    args.out.write_text(json.dumps({"link_mbit": args.mbit, "seconds": args.seconds, "mib": args.mib,
                                    "repeats": args.repeats, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(markdown(rows, args.mbit, args))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.md')}", highlight=False)


if __name__ == "__main__":
    main()
