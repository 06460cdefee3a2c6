"""The communicator's routed collectives over groups that span nvidia and amd (docs/vendors.md §8)
equal flat single-backend ones: all-reduce (sum, max) to fp32 rounding and the same bits on
every rank, broadcast, all-gather and reduce-scatter; bytes over the bridge as
planner.bridge counts them; and no single-backend call is made on a group spanning vendors.
One gloo world of WORLD processes (vendors are labels on CPU) serves every drawn case; the
flat reference is a torch.distributed group made by the test itself."""

from __future__ import annotations

import multiprocessing
import queue as queue_module

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.bridge import allreduce_bridge_bytes, gather_bridge_bytes

WORLD = 6
VENDORS = ("nvidia", "amd", "nvidia", "amd", "amd", "other")  # rank → vendor label
Case = tuple[tuple[int, ...], int, int]  # (group ranks, elements per rank, seed)


def _data(seed: int, rank: int, numel: int):
    import torch
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * seed + rank)) * (1 + rank)


def _check(comm, routed, flat, case: Case) -> dict:
    """This rank's findings for one case (the rank is in the group)."""
    import torch
    import torch.distributed as dist
    ranks, numel, seed = case
    x = _data(seed, comm.rank, numel)
    before = comm.meter.sent
    summed = comm.all_reduce(x.clone(), routed)
    reduce_bytes = comm.meter.sent - before
    ref = x.clone()
    dist.all_reduce(ref, group=flat)
    scale = float(sum(_data(seed, r, numel).abs() for r in ranks).max())
    high, low = summed.clone(), summed.clone()  # the same bits on every rank of the group
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=flat)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=flat)
    top = comm.all_reduce(x.clone(), routed, "max")
    flat_top = x.clone()
    dist.all_reduce(flat_top, op=dist.ReduceOp.MAX, group=flat)
    gathered = comm.all_gather(x, routed)
    cast = comm.broadcast(x.clone(), ranks[-1], routed)
    before = comm.meter.sent
    block = comm.reduce_scatter(torch.cat([_data(seed + 7, comm.rank, numel)] * 1 + [x] * (len(ranks) - 1)), routed)
    scatter_bytes = comm.meter.sent - before
    whole = torch.cat([_data(seed + 7, comm.rank, numel)] + [x] * (len(ranks) - 1))
    flat_whole = whole.clone()
    dist.all_reduce(flat_whole, group=flat)
    mine = flat_whole.narrow(0, ranks.index(comm.rank) * numel, numel)
    return {"sum_error": float((summed - ref).abs().max()) / scale, "same_bits": bool(torch.equal(high, low)),
            "max_equal": bool(torch.equal(top, flat_top)),
            "gather_equal": all(torch.equal(g, _data(seed, r, numel)) for g, r in zip(gathered, ranks)),
            "bcast_equal": bool(torch.equal(cast, _data(seed, ranks[-1], numel))),
            "scatter_error": float((block - mine).abs().max()) / float(flat_whole.abs().max()),
            "reduce_bytes": reduce_bytes, "scatter_bytes": scatter_bytes}


def _worker(rank: int, port: int, cases, results) -> None:
    import torch
    import torch.distributed as dist
    from planner.hardware import Vendor
    from runtime.communication.communicator import Communicator, RankPlace
    torch.set_num_threads(1)
    places = tuple(RankPlace(r, r, Vendor(v)) for r, v in enumerate(VENDORS))
    comm = Communicator.start("gloo", "127.0.0.1", port, rank, WORLD, places, 60.0, torch.device("cpu"))
    try:
        for index, case in iter(cases.get, None):
            routed, flat = comm.new_group(case[0]), dist.new_group(list(case[0]))  # every rank, one order
            if rank in case[0]:
                results.put((index, rank, _check(comm, routed, flat, case)))
        comm.close()
    except Exception as error:  # the parent reports it; the other ranks time out on their own
        results.put((-1, rank, f"{type(error).__name__}: {error}"))
        raise


@pytest.fixture(scope="module")
def world():
    from runtime.launch.launcher import free_port
    ctx = multiprocessing.get_context("forkserver")
    results, queues, port = ctx.Queue(), [ctx.Queue() for _ in range(WORLD)], free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queues[r], results), daemon=True) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    counter = iter(range(10**6))

    def run(case: Case) -> dict[int, dict]:
        index = next(counter)
        for q in queues:
            q.put((index, case))
        found = {}
        try:
            while len(found) < len(case[0]):
                got, rank, value = results.get(timeout=120)
                assert got >= 0, f"rank {rank}: {value}"
                found[rank] = value
        except queue_module.Empty:
            pytest.fail(f"only {len(found)} of {len(case[0])} ranks answered within 120 s")
        return found
    yield run
    for q in queues:
        q.put(None)
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()


mixed_groups = st.lists(st.sampled_from(range(WORLD)), min_size=2, max_size=WORLD, unique=True).filter(
    lambda ranks: {"nvidia", "amd"} <= {VENDORS[r] for r in ranks}).map(sorted)  # torch's group order


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ranks=mixed_groups, numel=st.integers(1, 300), seed=st.integers(0, 1000))
def test_routed_collectives_equal_flat_ones(world, ranks, numel, seed):
    found = world((tuple(ranks), numel, seed))
    spread = len({VENDORS[r] for r in ranks})
    for rank, f in found.items():
        assert f["sum_error"] <= 1e-6 * len(ranks) and f["same_bits"] and f["max_equal"], (rank, f)
        assert f["gather_equal"] and f["bcast_equal"] and f["scatter_error"] <= 1e-6 * len(ranks), (rank, f)
    # bytes over the bridge, all ranks together (fp32): the planner's routing volumes
    assert sum(f["reduce_bytes"] for f in found.values()) == allreduce_bridge_bytes(spread, 4 * numel)
    assert sum(f["scatter_bytes"] for f in found.values()) == gather_bridge_bytes(spread, 4 * numel * len(ranks))


def test_a_single_backend_call_on_a_group_spanning_vendors_is_refused():
    from planner.hardware import Vendor
    from runtime.communication.communicator import Communicator, Group
    mixed = Group((0, 1), (Vendor.nvidia, Vendor.amd), None)
    with pytest.raises(RuntimeError, match="would span nvidia and amd"):
        Communicator._handle(mixed)
    bridge = Group((0, 1), (Vendor.nvidia, Vendor.amd), None, is_bridge=True)
    assert Communicator._handle(bridge) is None  # the leaders' gloo bridge is the one exception
    assert Communicator._handle(Group((0, 1), (Vendor.nvidia, Vendor.other), None)) is None


def test_a_tensor_of_several_bridge_chunks_is_exchanged_whole(world):
    """The leaders exchange in duplex.CHUNK_BYTES pieces: 2.5 pieces of fp32 per rank, over all
    three vendors, still equal the flat collectives (the drawn cases above fit in one)."""
    from runtime.communication.duplex import CHUNK_BYTES
    ranks, numel = (0, 1, 5), 5 * CHUNK_BYTES // 8
    found = world((ranks, numel, 3))
    for rank, f in found.items():
        assert f["sum_error"] <= 1e-6 * len(ranks) and f["same_bits"] and f["max_equal"], (rank, f)
        assert f["gather_equal"] and f["bcast_equal"] and f["scatter_error"] <= 1e-6 * len(ranks), (rank, f)
    assert sum(f["reduce_bytes"] for f in found.values()) == allreduce_bridge_bytes(3, 4 * numel)
