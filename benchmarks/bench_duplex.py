"""gloo's own collectives against the communicator's direct exchanges of chunks, across a shaped
link of the emulated cluster (docs/testbed.md, runtime/README.md "Host tensors travel in chunks").

    .venv/bin/python benchmarks/bench_duplex.py [--mbit 200] [--mib 96] [--loopback] [--repeats 3] [--out FILE]

Two machines, one process each, their link shaped to `--mbit` (`--loopback`: both inside one
machine). Each operation moves the same bytes each way: half of a `--mib` MiB fp32 tensor (the
all-reduce: the whole tensor, which §3.4 prices x/bw for 2 ranks, the same as the others' x/2
each way); "exchange" is a message each way at once (a ring's step, crossing pipeline sends).
Columns: torch.distributed's own (gloo's collective; one isend/irecv pair), the communicator's
(`runtime.communication.duplex` on host tensors), each as the median of `--repeats` timed runs after one untimed, and both as a
multiple of one way alone (a send of the half tensor, the other side idle): what the cost model
prices every one of them at. Needs root (the testbed); prints one line and exits 1 where this
host cannot. Writes benchmarks/report/duplex.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

REPORT = Path(__file__).resolve().parent / "report"
PORT = 29650
OPS = ("exchange", "all_gather", "reduce_scatter", "all_to_all", "all_reduce")


def worker(rank: int, master: str, mib: int, repeats: int, out: str) -> None:
    """One machine's side: every operation both ways, then one way alone (rank 0 writes)."""
    import torch
    import torch.distributed as dist

    from planner.hardware import Vendor
    from runtime.communication.communicator import Communicator, RankPlace
    places = tuple(RankPlace(r, machine=r, vendor=Vendor.nvidia) for r in range(2))
    comm = Communicator.start("gloo", master, PORT, rank, 2, places, 600.0, torch.device("cpu"))
    n = (mib << 20) // 4
    x, half, group = torch.ones(n), torch.ones(n // 2), comm.new_group((0, 1))
    peer = 1 - rank
    own = {"exchange": lambda: [w.wait() for w in (dist.isend(half, peer), dist.irecv(torch.empty(n // 2), peer))],
           "all_gather": lambda: dist.all_gather([torch.empty(n // 2)] * 2, half, group=group.handle),
           "reduce_scatter": lambda: dist.reduce_scatter_single(torch.empty(n // 2), x, group=group.handle),
           "all_to_all": lambda: dist.all_to_all_single(torch.empty(n), x, group=group.handle),
           "all_reduce": lambda: dist.all_reduce(x, group=group.handle)}
    ours = {"exchange": lambda: comm.exchange([(half, peer)], [(torch.empty(n // 2), peer)], 0).wait(),
            "all_gather": lambda: comm.all_gather(half, group),
            "reduce_scatter": lambda: comm.reduce_scatter(x, group),
            "all_to_all": lambda: comm.all_to_all(x, send_sizes=[n // 2] * 2, recv_sizes=[n // 2] * 2, group=group),
            "all_reduce": lambda: comm.all_reduce(x, group)}
    found = {op: {"gloo": timed(own[op], comm, repeats), "communicator": timed(ours[op], comm, repeats)} for op in OPS}
    one_way = timed(lambda: dist.send(half, 1) if rank == 0 else dist.recv(torch.empty(n // 2), 0), comm, repeats)
    if rank == 0:
        Path(out).write_text(json.dumps({"one_way_s": one_way, "ops": found}))
    comm.close()


def timed(fn, comm, repeats: int) -> float:
    """The median over `repeats` runs of `fn` up to the barrier after it (so that each run starts
    with both ranks together), after one untimed run: the profiler's `round_trip.timed`."""
    from runtime.profiling.round_trip import timed as wall_seconds

    return statistics.median(wall_seconds(lambda: (fn(), comm.barrier()), repeats, warmup=1))


def measure(mbit: float, mib: int, repeats: int, loopback: bool = False) -> dict:
    import subprocess
    import tempfile

    from planner.hardware import Cluster, Machine
    from runtime.testbed import Testbed
    from runtime.testbed.layout import MBIT_PER_GBPS
    cluster = Cluster(name="duplex", inter_bw_gbps=1.25, machines=[
        Machine(name=f"duplex-{m}", gpu="RTX4090", count=1, intra_bw_gbps=16) for m in "ab"])
    with tempfile.TemporaryDirectory(prefix="bench-duplex-") as folder, \
            Testbed(cluster, scale=mbit / (1.25 * MBIT_PER_GBPS)) as bed:
        out = Path(folder) / "out.json"
        env = {"OMP_NUM_THREADS": "1", "LOCAL_WORLD_SIZE": "1", "PATH": "/usr/bin:/bin"}
        # --loopback: both ranks inside machine 0, over its loopback (what a collective inside one
        # machine meets on this host)
        procs = [bed.start(0 if loopback else m, [sys.executable, __file__, "--worker", str(m), bed.address(0), str(mib),
                                                  str(repeats), str(out)],
                           env={**env, "GLOO_SOCKET_IFNAME": "lo" if loopback else bed.slot(m).interface},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for m in range(2)]
        logs = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a worker failed: {logs}")
        return {"mbit": None if loopback else mbit, "mib": mib, "repeats": repeats, **json.loads(out.read_text())}


def table(result: dict) -> Table:
    one = result["one_way_s"]
    where = "over one machine's loopback" if result["mbit"] is None else f"across a {result['mbit']:g} Mbit/s link"
    out = Table(title=f"{result['mib'] / 2:g} MiB each way {where} (one way alone: {one:.3f} s)",
                caption="all_reduce moves the whole tensor: its price for 2 ranks, x/bw, is 2× one way")
    for column in ("operation", "gloo's own s", "× one way", "communicator s", "× one way"):
        out.add_column(column, justify="left" if column == "operation" else "right")
    for op, times in result["ops"].items():
        out.add_row(op, f"{times['gloo']:.3f}", f"{times['gloo'] / one:.2f}", f"{times['communicator']:.3f}",
                    f"{times['communicator'] / one:.2f}")
    return out


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        rank, master, mib, repeats, out = sys.argv[2:7]
        worker(int(rank), master, int(mib), int(repeats), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=200.0)
    parser.add_argument("--mib", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loopback", action="store_true", help="both ranks inside one machine")
    parser.add_argument("--out", type=Path, default=REPORT / "duplex.json")
    args = parser.parse_args()
    from runtime.testbed import unavailable_reason
    if (reason := unavailable_reason()) is not None:
        print(f"bench_duplex: {reason}")
        raise SystemExit(1)
    result = measure(args.mbit, args.mib, args.repeats, args.loopback)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    console = Console(record=True, width=100)
    console.print(table(result))
    args.out.with_suffix(".md").write_text(console.export_text())


if __name__ == "__main__":
    main()
