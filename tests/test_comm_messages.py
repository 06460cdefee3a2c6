"""Point-to-point messages are awaited without polling, even where a rank polls its
collectives (runtime.communication.communicator.Communicator.message_waiter): gloo's send and receive works do not
report their completion until they are waited on, so a polled wait on one spun its whole
SPIN_S (5 ms) on every message, however early the message had arrived. Two real gloo
processes: the receiver waits for a message that has long arrived, and the sender awaits a
send its peer has long received; neither wait may spin (the polling loop's yields are
counted, not timed: a wait's milliseconds on a shared 2-core machine say more about the
scheduler than about the waiter — it read 4.4 ms once under a loaded suite). The same world
checks the premise too — a raw gloo receive work whose message has arrived still says it is
not completed — so that a torch that fixes it shows up here."""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import socket

MESSAGES = 15
SETTLE_S = 0.05  # after a barrier, long enough for a 16 KiB message over loopback to land


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, results) -> None:
    import dataclasses
    import time

    import torch
    import torch.distributed as dist

    from planner.hardware import Vendor
    from runtime.communication import comm_types
    from runtime.communication.communicator import Communicator, RankPlace

    torch.set_num_threads(1)
    yields = [0]
    real_yield = comm_types.os.sched_yield

    def counted_yield():
        yields[0] += 1
        real_yield()

    comm_types.os.sched_yield = counted_yield  # this spawned process's own `os`
    places = tuple(RankPlace(r, r, Vendor.other) for r in range(2))
    comm = Communicator.start("gloo", "127.0.0.1", port, rank, 2, places, 60.0, torch.device("cpu"))
    comm = dataclasses.replace(comm, poll=True)  # as on a host whose ranks fit its cores
    buffer = torch.ones(4096)
    spins, premise = [], None
    try:
        for i in range(MESSAGES):
            pending = comm.send(buffer, 1, tag=i) if rank == 0 else None
            comm.barrier()
            time.sleep(SETTLE_S)
            before = yields[0]
            if rank == 0:
                pending.wait()
            else:
                comm.recv(torch.empty(4096), 0, tag=i)
            spins.append(yields[0] - before)
        if rank == 0:
            dist.send(buffer, 1, tag=99)
        else:
            work = dist.irecv(torch.empty(4096), 0, tag=99)
            time.sleep(0.3)
            premise = work.is_completed()
            work.wait()
        comm.close()
        results.put((rank, sum(spins), premise))
    except Exception as error:  # the parent reports it
        results.put((rank, f"{type(error).__name__}: {error}", None))
        raise


def test_a_message_that_has_arrived_is_taken_without_spinning():
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, port, results), daemon=True) for rank in range(2)]
    for p in procs:
        p.start()
    found = {}
    try:
        for _ in procs:
            rank, spun, premise = results.get(timeout=120)
            found[rank] = (spun, premise)
    except queue_module.Empty:
        raise AssertionError(f"the two ranks did not finish; got {found}") from None
    finally:
        for p in procs:
            p.join(timeout=30)
    for rank, (spun, _) in found.items():
        assert not isinstance(spun, str), f"rank {rank}: {spun}"
        # a polled wait on a message yields the core in a loop until SPIN_S has passed (53 yields
        # over 15 messages when `message_waiter` was made to poll)
        assert spun == 0, f"rank {rank} spun {spun} times waiting for {MESSAGES} messages that had arrived"
    assert found[1][1] is False, ("gloo's receive work now reports its completion: "
                                  "Communicator.message_waiter may poll again")
