"""Golden tests of the sequence-plan rank layout (docs/sequence-plans.md §7.1), positions derived by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from planner.sequence.plan import SeqPlan
from runtime.sequence.layout import LayoutError, seq_rank_layout
from seq_layouts import seq_plans


def _rows(layout):
    return [(r.rank, r.device, r.replica, r.group, r.member, r.heads, r.kv, r.tokens) for r in layout.ranks]


def test_one_group_of_two_uneven_members():
    # s = 8, a = k = 4: member 0 holds 3 heads and tokens 0-1, member 1 one head and 2-7.
    plan = SeqPlan.from_rings(problem="p", batches=[2], rings=[[[(5, 3, 2), (7, 1, 6)]]])
    layout = seq_rank_layout(plan, kv_heads=4)
    assert _rows(layout) == [(0, 5, 0, 0, 0, (0, 3), (0, 3), (0, 2)),
                             (1, 7, 0, 0, 1, (3, 4), (3, 4), (2, 8))]
    group = layout.group_of(1)
    assert group.spans == ((0, 4), (4, 8)) and (group.prev, group.next) == (0, 0)
    assert layout.positions_of(0).tolist() == [0, 1]
    assert layout.positions_of(1).tolist() == [2, 3, 4, 5, 6, 7]
    assert layout.replicas[0].batch == 2 and layout.replicas[0].ranks == (0, 1)
    assert layout.hp_group_keys == [(0, 1)]
    assert layout.ring_sends(0) == layout.ring_recvs(1) == []  # a ring of one group


def test_ring_of_three_uneven_groups():
    # s = 12, T = 4, 6, 2 → ℓ = 2, 3, 1, x = 0, 2, 5: g0 holds [0,2)+[10,12), g1 [2,5)+[7,10),
    # g2 [5,6)+[6,7). a = 4, k = 2 (GQA): the middle group splits kv heads 1 + 1.
    plan = SeqPlan.from_rings(problem="p", batches=[1], rings=[[
        [(0, 4, 4)], [(1, 2, 2), (2, 2, 4)], [(3, 4, 2)]]])
    layout = seq_rank_layout(plan, kv_heads=2)
    assert _rows(layout) == [(0, 0, 0, 0, 0, (0, 4), (0, 2), (0, 4)),
                             (1, 1, 0, 1, 0, (0, 2), (0, 1), (0, 2)),
                             (2, 2, 0, 1, 1, (2, 4), (1, 2), (2, 6)),
                             (3, 3, 0, 2, 0, (0, 4), (0, 2), (0, 2))]
    ring = layout.ring_of(2)
    assert [g.positions().tolist() for g in ring] == [[0, 1, 10, 11], [2, 3, 4, 7, 8, 9], [5, 6]]
    assert [(g.prev, g.next) for g in ring] == [(2, 1), (0, 2), (1, 0)]
    assert [layout.positions_of(r).tolist() for r in range(4)] == [[0, 1, 10, 11], [2, 3], [4, 7, 8, 9], [5, 6]]
    assert [g.ranks for g in ring] == [(0,), (1, 2), (3,)]
    # K/V travel g0 → g1 → g2 → g0, each piece to the next group's members that hold its kv heads
    assert [layout.ring_sends(r) for r in range(4)] == [[(1, (0, 1)), (2, (1, 2))], [(3, (0, 1))],
                                                        [(3, (1, 2))], [(0, (0, 2))]]
    assert [layout.ring_recvs(r) for r in range(4)] == [[(3, (0, 2))], [(0, (0, 1))], [(0, (1, 2))],
                                                        [(1, (0, 1)), (2, (1, 2))]]


def test_two_replicas_number_ranks_in_plan_order():
    # s = 4: replica 0 is one device; replica 1 a ring of two groups, T = 2 each:
    # g0 holds [0,1)+[3,4), g1 [1,2)+[2,3); g0's two members take one token and one head each.
    plan = SeqPlan.from_rings(problem="p", batches=[3, 1], rings=[
        [[(4, 2, 4)]], [[(2, 1, 1), (6, 1, 1)], [(9, 2, 2)]]])
    layout = seq_rank_layout(plan, kv_heads=2)
    assert _rows(layout) == [(0, 4, 0, 0, 0, (0, 2), (0, 2), (0, 4)),
                             (1, 2, 1, 0, 0, (0, 1), (0, 1), (0, 1)),
                             (2, 6, 1, 0, 1, (1, 2), (1, 2), (1, 2)),
                             (3, 9, 1, 1, 0, (0, 2), (0, 2), (0, 2))]
    assert [layout.positions_of(r).tolist() for r in range(4)] == [[0, 1, 2, 3], [0], [3], [1, 2]]
    assert [(r.batch, r.ranks) for r in layout.replicas] == [(3, (0,)), (1, (1, 2, 3))]
    assert layout.hp_group_keys == [(1, 2)]


@pytest.mark.parametrize("rings, kv_heads, reason", [
    ([[[(0, 4, 3)]], [[(1, 4, 4)]]], 2, "different sequence lengths"),
    ([[[(0, 4, 2)], [(1, 2, 2)]]], 2, "different head totals"),
    ([[[(0, 3, 2), (1, 1, 2)]]], 2, "not a multiple of a/k"),
    ([[[(0, 4, 3)]]], 2, "is odd"),
    ([[[(0, 4, 2)]], [[(0, 4, 2)]]], 2, "used twice"),
])
def test_refuses_what_it_cannot_lay_out(rings, kv_heads, reason):
    plan = SeqPlan.from_rings(problem="p", batches=[1] * len(rings), rings=rings)
    with pytest.raises(LayoutError, match=reason):
        seq_rank_layout(plan, kv_heads=kv_heads)


@settings(max_examples=40, deadline=None)
@given(seq_plans(max_ranks=8))
def test_layout_partitions_tokens_and_heads(drawn):
    plan, kv_heads = drawn
    layout = seq_rank_layout(plan, kv_heads=kv_heads)
    assert layout.world_size == len(plan.devices)
    assert [r.device for r in layout.ranks] == plan.devices
    for replica in layout.replicas:
        held = np.concatenate([layout.positions_of(r) for r in replica.ranks])
        assert sorted(held.tolist()) == list(range(layout.seq_len))
        for group in replica.groups:
            members = [layout.rank(r) for r in group.ranks]
            for field, total in (("heads", layout.heads), ("kv", layout.kv_heads), ("tokens", group.num_tokens)):
                spans = [getattr(m, field) for m in members]
                assert spans[0][0] == 0 and spans[-1][1] == total
                assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(spans, spans[1:] + [(total, total)]))
            for r in group.ranks:  # ring pieces: what r receives tiles its kv heads, and is sent to it
                recvs = layout.ring_recvs(r)
                if len(replica.groups) > 1:
                    assert [span for _, span in recvs][0][0] == layout.rank(r).kv[0]
                    assert all(a[1] == b[0] for (_, a), (_, b) in zip(recvs, recvs[1:]))
                    assert recvs[-1][1][1] == layout.rank(r).kv[1]
                assert all((r, span) in layout.ring_sends(src) for src, span in recvs)
            for m in members:  # whole kv heads: kv_i = heads_i·k/a
                assert (m.kv[1] - m.kv[0]) * layout.heads == (m.heads[1] - m.heads[0]) * layout.kv_heads
