"""Mixed-vendor clusters (docs/vendors.md §8), two tables.

1. The bridge measured on this machine: 4 processes labelled nvidia, nvidia, amd, amd. A routed
   all-reduce over all four (reduce inside each vendor, the two leaders over the gloo bridge,
   broadcast back) against a flat gloo group over the same ranks, and a point-to-point message
   across the bridge (host memory) against one inside a vendor. On CPU every backend is gloo:
   the table shows what the routing costs here, not an NCCL/RCCL or PCIe link.
2. On every bundled problem whose cluster mixes vendors: the heuristic's plan priced with the
   bridge, against a vendor-blind plan (solved as if every GPU were nvidia, then priced with the
   bridge): the factor blind T / aware T, and each plan's bridge-bound share of T.

    .venv/bin/python benchmarks/bench_vendor.py [--time-limit 20] [--sizes-mb 1,16] [--skip-measure]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench_timing import call_seconds  # noqa: E402
from planner.base import format_seconds  # noqa: E402
from planner.hardware import Cluster, Vendor  # noqa: E402
from planner.io import bundled_names, load_problem  # noqa: E402
from planner.kinds import iteration_time  # noqa: E402
from planner.layered.bridge import layered_bridge_traffic  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.sequence.bridge import sequence_bridge_traffic  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.registry import solve  # noqa: E402

console = Console(width=170)
VENDORS = ("nvidia", "nvidia", "amd", "amd")
REPEAT = 7


def _timed(fn, repeat: int = REPEAT) -> float:
    """Median seconds of `fn` over `repeat` calls after one warm-up."""
    return statistics.median(call_seconds(fn, repeat))


def _measure_worker(rank: int, port: int, sizes: list[int], out) -> None:
    import torch
    import torch.distributed as dist
    from runtime.communication.communicator import Communicator, RankPlace
    torch.set_num_threads(1)
    places = tuple(RankPlace(r, r, Vendor(v)) for r, v in enumerate(VENDORS))
    comm = Communicator.start("gloo", "127.0.0.1", port, rank, len(VENDORS), places, 120.0, torch.device("cpu"))
    routed, flat = comm.new_group((0, 1, 2, 3)), dist.new_group([0, 1, 2, 3])
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        row = {"bytes": nbytes,
               "routed": _timed(lambda: comm.all_reduce(x, routed)),
               "flat": _timed(lambda: dist.all_reduce(x, group=flat))}
        for name, peer in (("p2p_bridge", 2), ("p2p_vendor", 1)):  # rank 0 → peer and back
            def ping():
                if rank == 0:
                    comm.send(x, peer, 7).wait()
                    comm.recv(x, peer, 8)
                elif rank == peer:
                    comm.recv(x, 0, 7)
                    comm.send(x, 0, 8).wait()
            row[name] = _timed(ping) / 2  # one way
        rows.append(row)
    if rank == 0:
        out.put(rows)
    comm.close()


def measure(sizes_mb: list[float]) -> list[dict]:
    from runtime.launch.launcher import free_port
    ctx = multiprocessing.get_context("forkserver")
    out, port, sizes = ctx.Queue(), free_port(), [int(mb * 1e6) // 4 * 4 for mb in sizes_mb]
    procs = [ctx.Process(target=_measure_worker, args=(r, port, sizes, out)) for r in range(len(VENDORS))]
    for proc in procs:
        proc.start()
    rows = out.get(timeout=600)
    for proc in procs:
        proc.join(timeout=60)
    return rows


def measure_table(rows: list[dict]) -> Table:
    table = Table(title="the bridge on this machine (4 CPU processes: 2 labelled nvidia, 2 amd; gloo everywhere)")
    for col in ("message", "all-reduce routed", "flat gloo", "routed/flat", "p2p across bridge", "p2p in vendor"):
        table.add_column(col, justify="right")
    for r in rows:
        x = r["bytes"]
        table.add_row(f"{x / 1e6:g} MB", f"{r['routed'] * 1e3:.2f} ms", f"{r['flat'] * 1e3:.2f} ms",
                      f"{r['routed'] / r['flat']:.2f}x",
                      f"{x / r['p2p_bridge'] / 1e9:.2f} GB/s", f"{x / r['p2p_vendor'] / 1e9:.2f} GB/s")
    return table


def vendor_blind(problem: Problem) -> Problem:
    """The same problem with every GPU type relabelled nvidia: no bridge anywhere."""
    cluster = problem.cluster
    types = {m.gpu: cluster.catalog[m.gpu].model_copy(update={"vendor": Vendor.nvidia}) for m in cluster.machines}
    blind = Cluster.model_validate({**cluster.model_dump(), "gpu_types": [t.model_dump() for t in types.values()]})
    return problem.model_copy(update={"cluster": blind})


def compare(time_limit: float) -> list[dict]:
    rows = []
    for name in bundled_names("problems"):
        problem = load_problem(name)
        if not problem.cluster.mixes_vendors:
            continue
        kind = "sequence" if name.startswith("longctx-") else "layered"
        traffic = sequence_bridge_traffic if kind == "sequence" else layered_bridge_traffic
        options = SolverOptions(time_limit_s=time_limit, seed=0)
        aware = solve(problem, "heuristic", options, kind=kind)
        blind = solve(vendor_blind(problem), "heuristic", options, kind=kind)
        if aware.plan is None or blind.plan is None:
            rows.append({"problem": name, "kind": kind, "note": aware.message or blind.message})
            continue
        aware_t, blind_t = iteration_time(problem, aware.plan), iteration_time(problem, blind.plan)
        rows.append({"problem": name, "kind": kind, "devices": problem.cluster.num_devices,
                     "aware_s": aware_t, "blind_s": blind_t, "blind_unpriced_s": blind.objective_s,
                     "factor": blind_t / aware_t,
                     "aware_share": traffic(problem, aware.plan).share,
                     "blind_share": traffic(problem, blind.plan).share})
    return rows


def compare_table(rows: list[dict]) -> Table:
    table = Table(title="bridge-aware heuristic vs a vendor-blind plan priced with the bridge (docs/vendors.md §8)")
    for col in ("problem", "kind", "GPUs", "T aware", "T blind (as solved)", "T blind (with bridge)",
                "factor", "bridge share aware / blind"):
        table.add_column(col, justify="left" if col in ("problem", "kind") else "right")
    for r in rows:
        if "note" in r:
            table.add_row(r["problem"], r["kind"], "", "", "", "", "", r["note"])
            continue
        table.add_row(r["problem"], r["kind"], str(r["devices"]), format_seconds(r["aware_s"]),
                      format_seconds(r["blind_unpriced_s"]), format_seconds(r["blind_s"]), f"{r['factor']:.2f}x",
                      f"{r['aware_share']:.1%} / {r['blind_share']:.1%}")
    return table


def run(time_limit: float = 20.0, sizes_mb: list[float] | None = None, skip_measure: bool = False) -> dict:
    """Both tables, printed; their rows returned (benchmarks/run_all.py keeps them)."""
    measured = [] if skip_measure else measure(sizes_mb or [1.0, 16.0])
    if measured:
        console.print(measure_table(measured))
    compared = compare(time_limit)
    console.print(compare_table(compared))
    return {"measured": measured, "compared": compared}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per heuristic run")
    parser.add_argument("--sizes-mb", default="1,16", help="message sizes of the measured table, MB")
    parser.add_argument("--skip-measure", action="store_true", help="only the planning table")
    args = parser.parse_args()
    run(args.time_limit, [float(x) for x in args.sizes_mb.split(",")], args.skip_measure)


if __name__ == "__main__":
    main()
