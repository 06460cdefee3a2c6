"""The stage model in one process (TP 1, no process group) against the reference model:
same loss and gradients, for gated and plain MLPs, with and without recomputation; and a
model split into two stages by hand gives the same result as the whole."""

from __future__ import annotations

import pytest
import torch

from planner.workload import ModelSpec
from runtime.model.data import BatchLoader, SyntheticSource
from runtime.layered.layout import StageRanks
from runtime.layered.stage import StageModel
from runtime.model.llama import ReferenceLlama


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def stage(layers: tuple[int, int], first: bool, last: bool) -> StageRanks:
    return StageRanks(pipeline=0, stage=0 if first else 1, ranks=(0,), devices=(0,),
                      layer_start=layers[0], layer_end=layers[1], first=first, last=last)


@pytest.mark.parametrize("gated,recompute", [(True, False), (True, True), (False, False)])
def test_single_stage_equals_reference(gated: bool, recompute: bool):
    spec = ModelSpec(name="m", layers=3, hidden=32, heads=4, kv_heads=2, ffn_hidden=48, vocab=256, gated=gated)
    tokens, labels = BatchLoader(SyntheticSource(256, seed=1), seq_len=12).batch(0, 0, 3)
    ref = ReferenceLlama(spec, 12, seed=5)
    ref_loss = ref(tokens, labels)
    ref_loss.backward()
    whole = StageModel(spec, stage((0, 3), True, True), 0, None, 12, seed=5, recompute=recompute)
    loss = whole(tokens, labels, 1.0 / labels.numel())
    loss.backward()
    assert torch.allclose(loss, ref_loss, rtol=1e-6)
    for name, param, _ in [s for u in range(spec.layers + 2) for s in whole.unit_shards(u)]:
        assert torch.allclose(param.grad, ref.p(name).grad, rtol=1e-4, atol=1e-7), name


def test_two_hand_split_stages_equal_the_whole():
    spec = ModelSpec(name="m", layers=3, hidden=32, heads=4, kv_heads=4, ffn_hidden=48, vocab=256)
    tokens, labels = BatchLoader(SyntheticSource(256, seed=2), seq_len=8).batch(1, 0, 2)
    front = StageModel(spec, stage((0, 2), True, False), 0, None, 8, seed=0)
    back = StageModel(spec, stage((2, 3), False, True), 0, None, 8, seed=0)
    assert {n for u in back.stage.units(3) for n, _, _ in back.unit_shards(u)} == {
        *(f"layers.2.{k}" for k in ("attn_norm.weight", "attn.q.weight", "attn.k.weight", "attn.v.weight",
                                    "attn.o.weight", "mlp_norm.weight", "mlp.gate.weight", "mlp.up.weight",
                                    "mlp.down.weight")), "norm.weight", "head.weight"}
    hidden = front(tokens, None, 1.0)
    split_loss = back(hidden.detach(), labels, 1.0 / labels.numel())
    ref_loss = ReferenceLlama(spec, 8, seed=0)(tokens, labels)
    assert torch.allclose(split_loss, ref_loss, rtol=1e-6)


def test_communicator_in_a_one_process_world():
    """Every collective of the communicator on a world of one (gloo): identities; groups
    carry their ranks' vendors."""
    from planner.hardware import Vendor
    from runtime.communication.communicator import Communicator, Group, RankPlace
    from runtime.launch.launcher import free_port

    comm = Communicator.start("gloo", "127.0.0.1", free_port(), 0, 1, (RankPlace(3, 0, Vendor.amd),), 10,
                              torch.device("cpu"))
    try:
        group = comm.new_group((0,))
        assert group.ranks == (0,) and group.vendors == (Vendor.amd,) and not group.mixes_vendors
        x = torch.arange(4.0)
        assert torch.equal(comm.all_reduce(x.clone(), comm.world, "max"), x)
        assert torch.equal(comm.broadcast(x.clone(), 0, group), x)
        assert [t.tolist() for t in comm.all_gather(x, group)] == [x.tolist()]
        assert comm.vendor_of(0) is Vendor.amd and comm.machine_of(0) == 0
    finally:
        comm.close()
    assert Group((0, 1), (Vendor.nvidia, Vendor.amd), None).mixes_vendors
    assert not Group((0, 1), (Vendor.nvidia, Vendor.other), None).mixes_vendors
