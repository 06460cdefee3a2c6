"""The communicator's all-gather, reduce-scatter and all-to-all on host tensors, which run as
direct exchanges of chunks (`runtime.communication.duplex`), against what each must give,
derived on every rank from the other ranks' data (each rank can make any rank's tensor from
its seed): all-gather and all-to-all bit for bit, reduce-scatter bit for bit against the blocks
summed in group order. Cases: groups of 2, 3 and 4 ranks and the default group (no handle);
tensors of one element to several chunks; uneven all-to-all runs, empty ones among them.
Point to point: a ring exchange both ways of messages of several chunks, and a send/receive
pair, arrive bit for bit; a tag outside the runtime's range is refused. A message on the
default group at a small tag, posted before a collective over the world and received after
it, arrives intact (the collectives' tags stay out of the runtime's way)."""

from __future__ import annotations

import multiprocessing

import pytest

WORLD = 4
CHUNK_ELEMENTS = (128 << 10) // 4  # duplex.CHUNK_BYTES of fp32 (checked below)
# (group ranks, elements per rank, seed); None: the world through the default group
CASES = [((0, 1), 1, 0), ((0, 1), 5 * CHUNK_ELEMENTS // 2, 1), ((1, 2, 3), 301, 2), (None, 7, 3),
         (None, 2 * CHUNK_ELEMENTS + 3, 4), ((0, 3), 64, 5)]


def _data(seed: int, rank: int, numel: int):
    import torch
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * seed + rank)) * (1 + rank)


def _runs(seed: int, src: int, ranks: tuple[int, ...], numel: int) -> list[int]:
    """How many elements rank `src` sends each rank of the group in the all-to-all: uneven,
    some empty, the same on every rank (a function of the seed)."""
    import random
    rng = random.Random(seed * 97 + src)
    return [rng.choice((0, 1, numel, 2 * numel + 1)) for _ in ranks]


def _check(comm, group, ranks: tuple[int, ...], numel: int, seed: int) -> dict:
    import torch
    me, n = comm.rank, len(ranks)
    gathered = comm.all_gather(_data(seed, me, numel), group)
    gather_ok = all(torch.equal(g, _data(seed, r, numel)) for g, r in zip(gathered, ranks))
    block = comm.reduce_scatter(_data(seed + 50, me, n * numel), group)
    index = ranks.index(me)
    expected = _data(seed + 50, ranks[0], n * numel).split(numel)[index].clone()
    for r in ranks[1:]:
        expected.add_(_data(seed + 50, r, n * numel).split(numel)[index])
    sends = _runs(seed, me, ranks, numel)
    recvs = [_runs(seed, r, ranks, numel)[index] for r in ranks]
    mixed = comm.all_to_all(_data(seed + 90, me, sum(sends)), send_sizes=sends, recv_sizes=recvs, group=group)
    from_each = [_data(seed + 90, r, sum(_runs(seed, r, ranks, numel))).split(_runs(seed, r, ranks, numel))[index]
                 for r in ranks]
    return {"gather": gather_ok, "scatter": bool(torch.equal(block, expected)),
            "all_to_all": bool(torch.equal(mixed, torch.cat(from_each)))}


def _messages(comm) -> dict:
    """A ring exchange both ways (messages of 2.5 chunks, and of one element) and a send from
    each rank to the next of 3 chunks + 1 element, received by the next."""
    import torch
    me, left, right = comm.rank, (comm.rank - 1) % WORLD, (comm.rank + 1) % WORLD
    sizes = (5 * CHUNK_ELEMENTS // 2, 1)
    buffers = [torch.empty(n) for n in sizes]
    pending = comm.exchange([(_data(9, me, n), dst) for n, dst in zip(sizes, (right, left))],
                            list(zip(buffers, (left, right))), 7)
    pending.wait()
    ring = all(torch.equal(b, _data(9, src, n)) for b, n, src in zip(buffers, sizes, (left, right)))
    sent = comm.send(_data(11, me, 3 * CHUNK_ELEMENTS + 1), right, 8)
    arrived = comm.recv(torch.empty(3 * CHUNK_ELEMENTS + 1), left, 8)
    sent.wait()
    try:
        comm.send(torch.ones(1), right, 1 << 18)
        refused = False
    except ValueError:
        refused = True
    return {"ring": ring, "pair": bool(torch.equal(arrived, _data(11, left, 3 * CHUNK_ELEMENTS + 1))),
            "bad_tag_refused": refused}


def _worker(rank: int, port: int, results) -> None:
    import torch
    from planner.hardware import Vendor
    from runtime.communication.communicator import Communicator, RankPlace
    torch.set_num_threads(1)
    places = tuple(RankPlace(r, r, Vendor.nvidia) for r in range(WORLD))
    comm = Communicator.start("gloo", "127.0.0.1", port, rank, WORLD, places, 60.0, torch.device("cpu"))
    try:
        found = {}
        for index, (ranks, numel, seed) in enumerate(CASES):
            group = comm.world if ranks is None else comm.new_group(ranks)  # every rank, one order
            ranks = ranks or tuple(range(WORLD))
            if rank in ranks:
                found[index] = _check(comm, group, ranks, numel, seed)
        found["messages"] = _messages(comm)
        marker = torch.full((3,), float(rank))
        pending = comm.send(marker, (rank + 1) % WORLD, 0)  # tag 0 on the default group
        comm.all_gather(torch.ones(CHUNK_ELEMENTS + 1), comm.world)
        arrived = comm.recv(torch.empty(3), (rank - 1) % WORLD, 0)
        pending.wait()
        found["message"] = bool(torch.equal(arrived, torch.full((3,), float((rank - 1) % WORLD))))
        comm.close()
        results.put((rank, found))
    except Exception as error:  # the parent reports it; the other ranks time out on their own
        results.put((rank, f"{type(error).__name__}: {error}"))
        raise


@pytest.fixture(scope="module")
def found() -> dict[int, dict]:
    from runtime.launch.launcher import free_port
    ctx = multiprocessing.get_context("forkserver")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, results), daemon=True) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    try:
        answers = dict(results.get(timeout=180) for _ in range(WORLD))
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    failed = {r: a for r, a in answers.items() if isinstance(a, str)}
    assert not failed, failed
    return answers


@pytest.mark.parametrize("index", range(len(CASES)))
def test_direct_collectives_give_what_each_must(found, index):
    ranks = CASES[index][0] or tuple(range(WORLD))
    for rank in ranks:
        assert found[rank][index] == {"gather": True, "scatter": True, "all_to_all": True}, (rank, CASES[index])


def test_a_message_at_a_small_tag_survives_a_collective_over_the_world(found):
    assert all(found[r]["message"] for r in range(WORLD))


def test_messages_of_several_chunks_arrive_whole(found):
    from runtime.communication.duplex import CHUNK_BYTES
    assert CHUNK_ELEMENTS * 4 == CHUNK_BYTES  # the cases above span the chunks they claim
    for r in range(WORLD):
        assert found[r]["messages"] == {"ring": True, "pair": True, "bad_tag_refused": True}, r


def test_only_host_tensors_between_machines_go_direct():
    """Chunks both ways where gloo's own ran one way at a time (between machines); inside a
    machine, on CUDA, or where machines are unknown, the backend's own."""
    import torch
    from planner.hardware import Vendor
    from runtime.communication.communicator import Communicator, RankPlace
    places = (RankPlace(0, 0, Vendor.nvidia), RankPlace(1, 0, Vendor.nvidia), RankPlace(2, 1, Vendor.nvidia),
              RankPlace(3, None, Vendor.nvidia))
    comm = Communicator(0, 4, places, 10.0, torch.device("cpu"))
    host = torch.ones(2)
    assert comm._direct(host, (0, 2)) and comm._direct(host, (0, 1, 2))
    assert not comm._direct(host, (0, 1)) and not comm._direct(host, (0, 3)) and not comm._direct(host, (0, 2, 3))
    assert not comm._direct(torch.ones(2, device="meta"), (0, 2))
