"""Ring + Ulysses attention of sequence plans equals full causal attention (docs/sequence-plans.md §7.1):
output and the gradients of q, k and v, to 1e-6 relative (fp32, in norm over the sequence),
on random inputs, uneven tokens and heads, GQA included. One gloo world of WORLD processes
serves every layout of the module; every rank compares its own rows with
`runtime.model.llama.causal_attention` over the whole sequence, computed in that process."""

from __future__ import annotations

import multiprocessing
import queue as queue_module

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.sequence.plan import SeqPlan
from seq_layouts import seq_plans

WORLD = 6
TOLERANCE = 1e-6
Case = tuple[str, int, str, bool]  # (plan JSON, kv heads, kernel, recompute)


def _errors(layout, rank: int, comm, groups: dict, case: Case, seed: int) -> dict[str, tuple[float, float]]:
    """(‖distributed − reference‖², ‖reference‖²) over `rank`'s rows, for the output and the
    q, k, v gradients. The reference is computed in fp64 from the same fp32 inputs: the
    exact answer. Norms, not elements: one-process fp32 attention itself is up to 6e-7 off
    the exact answer in ‖·‖ (measured over 1800 draws) but up to 1.4e-6 in its worst element
    (relative to the largest), so an elementwise 1e-6 would test fp32, not the ring."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from runtime.model.llama import causal_attention
    from runtime.sequence.attention import AttentionContext, sequence_attention

    me, group = layout.rank(rank), layout.group_of(rank)
    gen = torch.Generator().manual_seed(seed + me.replica)
    b, d, s = 2, 3, layout.seq_len
    q, k, v = (torch.randn(b, s, n, d, generator=gen) for n in (layout.heads, layout.kv_heads, layout.kv_heads))
    weight = torch.randn(b, s, layout.heads * d, generator=gen)
    full = [x.double().requires_grad_() for x in (q, k, v)]  # the exact answer, to fp32's precision
    reference = causal_attention(*full)
    (reference * weight.double()).sum().backward()
    rows = torch.as_tensor(layout.positions_of(rank))
    mine = [x[:, rows].clone().requires_grad_() for x in (q, k, v)]
    _, _, kernel, recompute = case
    ctx = AttentionContext.build(layout=layout, rank=rank, comm=comm, hp_group=groups.get(group.ranks), kernel=kernel)
    if recompute:  # as the training step runs it with recompute on: the forward (and its ring) twice
        out = checkpoint(lambda *x: sequence_attention(*x, ctx=ctx), *mine, use_reentrant=False)
    else:
        out = sequence_attention(*mine, ctx=ctx)
    (out * weight[:, rows]).sum().backward()
    pairs = {"out": (out, reference.detach()[:, rows])} | {f"d{n}": (m.grad, f.grad[:, rows]) for n, m, f in zip("qkv", mine, full)}
    return {name: (float((got.detach() - want).square().sum()), float(want.square().sum()))
            for name, (got, want) in pairs.items()}


def _worker(rank: int, port: int, cases, results) -> None:
    """Serve cases from `cases` (this rank's queue) until None, one result per case and rank held."""
    import torch

    from runtime.communication.communicator import Communicator, RankPlace
    from runtime.sequence.layout import seq_rank_layout

    torch.set_num_threads(1)
    comm = Communicator.start("gloo", "127.0.0.1", port, rank, WORLD, tuple(RankPlace(r) for r in range(WORLD)),
                              60.0, torch.device("cpu"))
    try:
        for index, case in iter(cases.get, None):
            layout = seq_rank_layout(SeqPlan.model_validate_json(case[0]), kv_heads=case[1])
            groups = {key: comm.new_group(key) for key in layout.hp_group_keys}  # every rank, one order
            if rank < layout.world_size:
                replica = layout.rank(rank).replica
                results.put((index, rank, (replica, _errors(layout, rank, comm, groups, case, seed=index))))
        comm.close()
    except Exception as error:  # the parent reports it; the other ranks time out on their own
        results.put((-1, rank, f"{type(error).__name__}: {error}"))
        raise


class _World:
    """WORLD gloo processes started once for the module; `run` hands them layouts."""

    def __init__(self):
        from runtime.launch.launcher import free_port

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "runtime.communication.communicator"])  # no effect if the server runs already
        self.results, self.queues, port = ctx.Queue(), [ctx.Queue() for _ in range(WORLD)], free_port()
        self.procs = [ctx.Process(target=_worker, args=(rank, port, self.queues[rank], self.results), daemon=True)
                      for rank in range(WORLD)]
        for proc in self.procs:
            proc.start()
        self.sent = 0

    def run(self, cases: list[Case]) -> dict[tuple[int, int], tuple[int, dict[str, tuple[float, float]]]]:
        """Every (case, rank)'s replica and squared norms (case numbered inside `cases`)."""
        first, self.sent = self.sent, self.sent + len(cases)
        for index, case in enumerate(cases, start=first):
            for q in self.queues:
                q.put((index, case))
        expected, found = sum(_world_of(case) for case in cases), {}
        try:
            while len(found) < expected:
                index, rank, errors = self.results.get(timeout=120)
                assert index >= 0, f"rank {rank}: {errors}"
                found[index - first, rank] = errors
        except queue_module.Empty:
            pytest.fail(f"only {len(found)} of {expected} results within 120 s")
        return found

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


@pytest.fixture(scope="module")
def world():
    started = _World()
    yield started
    started.close()


def _world_of(case: Case) -> int:
    return len(SeqPlan.model_validate_json(case[0]).devices)


def _case(rings, *, kv_heads: int, kernel: str = "auto", recompute: bool = False, batches=None) -> Case:
    plan = SeqPlan.from_rings(problem="t", batches=batches or [1] * len(rings), rings=rings)
    return plan.to_json(), kv_heads, kernel, recompute


def _relative_errors(found: dict) -> dict[tuple[int, int, str], float]:
    """‖distributed − reference‖ / ‖reference‖ of each (case, replica, tensor), over the
    whole sequence: the rows of every rank of the replica together."""
    sums = {}
    for (index, _), (replica, norms) in found.items():
        for name, (diff, ref) in norms.items():
            total = sums.setdefault((index, replica, name), [0.0, 0.0])
            total[0], total[1] = total[0] + diff, total[1] + ref
    return {key: (diff / ref) ** 0.5 for key, (diff, ref) in sums.items()}


def _assert_exact(found: dict) -> None:
    bad = {key: error for key, error in _relative_errors(found).items() if not error <= TOLERANCE}
    assert not bad, f"relative errors above {TOLERANCE:g} (case, replica, tensor): {bad}"


NAMED = [
    # one group of 2 members: heads 3 + 1 (a = k = 4), tokens 2 + 10 of s = 12
    _case([[[(0, 3, 2), (1, 1, 10)]]], kv_heads=4),
    # a ring of 3 groups, T = 4, 10, 6, GQA a = 6, k = 3, heads split 6 | 4 + 2 | 2 + 2 + 2
    _case([[[(0, 6, 4)], [(1, 4, 3), (2, 2, 7)], [(3, 2, 1), (4, 2, 2), (5, 2, 3)]]], kv_heads=3),
    # the same ring on the matmul kernel (the one used off CPU)
    _case([[[(0, 6, 4)], [(1, 4, 3), (2, 2, 7)], [(3, 2, 1), (4, 2, 2), (5, 2, 3)]]], kv_heads=3, kernel="math"),
    # the same ring recomputed (activation checkpointing): its sends run twice in the forward
    _case([[[(0, 6, 4)], [(1, 4, 3), (2, 2, 7)], [(3, 2, 1), (4, 2, 2), (5, 2, 3)]]], kv_heads=3, recompute=True),
    # a single member: plain attention, GQA a = 4, k = 2
    _case([[[(0, 4, 8)]]], kv_heads=2),
    # two replicas, 3:1 batches: one of two groups (first of two members), one of a single device;
    # the 2-group ring sends and receives between the same ranks
    _case([[[(0, 2, 2), (1, 2, 4)], [(2, 4, 6)]], [[(3, 4, 12)]]], kv_heads=2, batches=[3, 1]),
]


def test_named_layouts_equal_full_attention(world):
    _assert_exact(world.run(NAMED))


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(drawn=st.lists(seq_plans(max_ranks=WORLD), min_size=2, max_size=2))
def test_random_uneven_layouts_equal_full_attention(world, drawn):
    cases = [(plan.to_json(), kv_heads, "auto", False) for plan, kv_heads in drawn]
    _assert_exact(world.run(cases))


def _lone_comm():
    """A communicator that never joined a world: enough for a group of one in a ring of one,
    which sends nothing."""
    import torch

    from runtime.communication.communicator import Communicator, RankPlace

    return Communicator(rank=0, world_size=1, places=(RankPlace(0),), timeout_s=1.0, device=torch.device("cpu"))


def test_context_and_call_refuse_what_does_not_match_the_layout():
    import torch

    from runtime.sequence.attention import AttentionContext, sequence_attention
    from runtime.sequence.layout import seq_rank_layout

    pair = seq_rank_layout(SeqPlan.from_rings(problem="t", batches=[1], rings=[[[(0, 3, 2), (1, 1, 10)]]]),
                           kv_heads=4)
    with pytest.raises(ValueError, match=r"HP group must be ranks \(0, 1\)"):
        AttentionContext.build(layout=pair, rank=1, comm=_lone_comm(), hp_group=None)
    lone = seq_rank_layout(SeqPlan.from_rings(problem="t", batches=[1], rings=[[[(0, 4, 8)]]]), kv_heads=2)
    ctx = AttentionContext.build(layout=lone, rank=0, comm=_lone_comm(), hp_group=None)
    q, kv = torch.zeros(1, 8, 4, 3), torch.zeros(1, 8, 2, 3)
    assert sequence_attention(q, kv, kv, ctx=ctx).shape == (1, 8, 12)
    for bad_q, bad_kv in ((torch.zeros(1, 6, 4, 3), kv), (q, torch.zeros(1, 8, 4, 3))):
        with pytest.raises(ValueError, match="for 8 tokens, 4 heads, 2 kv heads"):
            sequence_attention(bad_q, bad_kv, bad_kv, ctx=ctx)
