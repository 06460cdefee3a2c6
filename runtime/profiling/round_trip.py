"""Direct small-message timings between two ranks, beside a profile's fitted latency:
`python -m runtime.profiling.round_trip RANK MASTER PORT REPEATS OUT.json SPEC.json` in each of
two processes (rank 0 hosts the store at MASTER:PORT; rank 1 writes OUT).

Each timing is an operation a profile's fit prices, on the same path (the communicator, gloo),
with a 4-byte message so that the bytes weigh nothing: a ping-pong (half of it is one way: p2p's
α) and a 2-rank all-reduce (allreduce(2, x) = x/bw + 2α: half of it is α). "after compute": as
the profile times its links, after the compute a run does between two collectives (SPEC's
`compute_gap`), so the wake-up of a rank that was computing is in it as it is in the fit's α
(docs/calibration.md §9); "back to back": without it. A raw TCP ping-pong between the two
(TCP_NODELAY) shows what the network itself takes, without gloo.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

from runtime.communication.communicator import Communicator, RankPlace
from runtime.launch.worker import die_with_parent
from runtime.profiling.launcher import ProfileSpec
from runtime.profiling.measure import Meter, collective_seconds, compute_gap, mean_of_timers, one_way_seconds

WARMUP = 20
TCP_PORT_OFFSET = 1  # the raw TCP ping-pong listens on PORT + 1 at rank 0


def timed(fn, repeats: int, warmup: int = WARMUP) -> list[float]:
    """The wall seconds of each of `repeats` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def gloo_timings(comm: Communicator, repeats: int) -> dict[str, list[float]]:
    """Back to back: one-way seconds of a 4-byte ping-pong (half the round trip) and α of a
    4-byte all-reduce (half of it)."""
    buffer, peer = torch.ones(1), 1 - comm.rank

    def ping_pong() -> None:
        if comm.rank == 0:
            comm.send(buffer, peer, 0).wait()
            comm.recv(buffer, peer, 1)
        else:
            comm.recv(buffer, peer, 0)
            comm.send(buffer, peer, 1).wait()

    p2p = [t / 2 for t in timed(ping_pong, repeats)]
    comm.barrier()
    all_reduce = [t / 2 for t in timed(lambda: comm.all_reduce(buffer, comm.world), repeats)]
    return {"p2p": p2p, "all_reduce": all_reduce}


def after_compute(comm: Communicator, spec: ProfileSpec, repeats: int) -> dict[str, list[float]]:
    """As the profile times its links: each 4-byte operation after the compute gap, what it adds
    (p2p: rank 0's half ping-pong; all-reduce: half the mean over both ranks: α)."""
    device, buffer = torch.device("cpu"), torch.ones(1)
    meter, gap = Meter(spec.model_copy(update={"warmup": WARMUP}), device), compute_gap(spec, 2, device)
    p2p = one_way_seconds(meter, comm, (0, 1), buffer, gap, repeats)
    p2p = mean_of_timers(comm, p2p if comm.rank == 0 else None, 1, repeats, device)
    reduce = collective_seconds(meter, comm, "all_reduce", comm.world, buffer, gap, repeats)
    reduce = mean_of_timers(comm, reduce, 2, repeats, device)
    return {"p2p after compute": p2p, "all_reduce after compute": [t / 2 for t in reduce]}


def tcp_one_way(rank: int, master: str, port: int, repeats: int) -> list[float]:
    """Half of each raw TCP round trip of one byte (rank 0 echoes, rank 1 times)."""
    if rank == 0:
        with socket.create_server(("", port)) as server:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for _ in range(WARMUP + repeats):
                    conn.sendall(conn.recv(1))
        return []
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((master, port), timeout=30)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return [t / 2 for t in timed(lambda: (conn.sendall(b"x"), conn.recv(1)), repeats)]


def summary(times: list[float]) -> dict:
    return {"median_us": statistics.median(times) * 1e6, "mean_us": statistics.fmean(times) * 1e6,
            "fastest_us": min(times) * 1e6, "repeats": len(times)}


def main(argv: list[str]) -> int:
    die_with_parent()
    rank, master, port, repeats, out = int(argv[0]), argv[1], int(argv[2]), int(argv[3]), argv[4]
    spec = ProfileSpec.model_validate_json(Path(argv[5]).read_text())
    torch.set_num_threads(1)
    comm = Communicator.start("gloo", master, port, rank, 2, (RankPlace(device=0, machine=0),
                                                             RankPlace(device=1, machine=1)), 60.0, torch.device("cpu"))
    gloo = gloo_timings(comm, repeats) | after_compute(comm, spec, repeats)
    comm.barrier()
    tcp = tcp_one_way(rank, master, port + TCP_PORT_OFFSET, repeats)
    comm.barrier()
    if rank == 1:
        result = {op: summary(times) for op, times in gloo.items()} | {"tcp": summary(tcp)}
        Path(out).write_text(json.dumps(result, indent=1))
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
