"""The communicator's vendor routing on CPU (docs/vendors.md §8; vendors are labels, every backend
gloo): a layered plan whose pipelines and DP chunk groups cross the nvidia–amd bridge trains
like one process, and the bytes it sends over the bridge per step are the planner's count."""

from __future__ import annotations

import pytest
import torch

from planner.io import load_cluster, load_plan
from planner.layered.bridge import layered_bridge_bytes
from planner.layered.table import stage_table
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec
from runtime.config import Job, RunConfig
from runtime.launch.launcher import launch_local
from runtime.model.reference import load_pipeline_params, train_reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RTOL = 1e-5
GQA = ModelSpec(name="gqa", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)


def test_mixed_vendor_plan_trains_like_one_process_and_meters_the_bridge(tmp_path):
    """tiny-mixed-4: pipeline 0 = nv-0 [0] → amd-0 [2], pipeline 1 = amd-1 [3, 4] (TP 2) → nv-1
    [5]; both stage boundaries and both layer groups' DP chunks cross the bridge."""
    cluster, plan = load_cluster("tiny-mixed-4"), load_plan("tiny-mixed-4")
    config = RunConfig(model=GQA, seq_len=16, micro_batch=2, steps=3, recompute=True, dump_params=True,
                       out_dir=str(tmp_path), timeout_s=60)
    result = launch_local(Job(plan=plan, config=config, cluster=cluster), echo=False)
    assert result.ok, result.failure_summary() + "\n".join(result.logs)
    ref_losses, ref_state = train_reference(config, 8)
    losses = [s["loss"] for s in result.steps]
    assert len(losses) == 3 and ref_losses[-1] < ref_losses[0]
    for loss, ref in zip(losses, ref_losses):
        assert abs(loss - ref) <= RTOL * abs(ref), (losses, ref_losses)
    pipelines = load_pipeline_params(tmp_path)
    for params in pipelines:
        for name, ref in ref_state.items():
            assert (params[name] - ref).norm() <= RTOL * ref.norm(), name
    assert all(torch.equal(pipelines[1][n], pipelines[0][n]) for n in ref_state)
    assert result.replicas_identical is True
    # Bytes over the bridge per step, by hand (fp32 on the wire: β = γ = 4 bytes):
    #   PP: 2 pipelines × 1 crossing boundary × (activation + gradient) × m = 2 micro-batches
    #       × b·s·h·4 = 2·16·32·4 = 4096 bytes  → 2·2·2·4096 = 32768
    #   DP: every unit's two holders are one nvidia and one amd rank (V = 2): each sends its
    #       chunks to the other, V·(V−1)·P·4 over P_total = 4·P_layer + P_emb + P_head with
    #       P_layer = 32·(32 + 2·2·8) + 32² + 3·32·64 + 2·32 = 9280, P_emb = 8192, P_head = 8224
    #       → P_total = 53536 (the reference model's own count, below) → 2·53536·4 = 428288
    assert sum(t.numel() for t in ref_state.values()) == 53536
    assert [s["bridge_bytes"] for s in result.steps] == [32768 + 428288] * 3
    problem = Problem(cluster=cluster, model=GQA, training=TrainingSpec(
        seq_len=16, global_batch=8, micro_batch=2, act_bytes=4, grad_bytes=4))
    assert layered_bridge_bytes(problem, stage_table(problem, plan)) == {"pp": 32768, "dp": 428288}


COMMAND = "python -m runtime.launch.torchrun "  # torchrun's agent, wrapped (runtime/launch/torchrun.py)


def test_torchrun_commands_name_each_machines_torch_build(tmp_path):
    from typer.testing import CliRunner

    from hexiscale.cli import app
    result = CliRunner().invoke(app, ["run", "tiny-mixed-4-tiny", "tiny-mixed-4", "--torchrun", "--backend", "nccl",
                                      "--out", str(tmp_path)])  # gloo runs on the CPU: no vendor build needed
    assert result.exit_code == 0, result.output
    lines = [" ".join(ln.split()) for ln in result.output.splitlines() if ln.startswith(("# machine", COMMAND))]
    notes, commands = lines[0::2], lines[1::2]
    assert len(notes) == len(commands) == 4 and all(c.startswith(COMMAND) for c in commands)
    builds = {note.split()[2]: note for note in notes}  # machine name → its note
    assert "(nvidia): a CUDA build" in builds["nv-0"] and "(nvidia): a CUDA build" in builds["nv-1"]
    assert "(amd): a ROCm build" in builds["amd-0"] and "RCCL" in builds["amd-1"]
    assert all("over gloo in host memory" in note for note in notes)


def test_sequence_replicas_on_two_vendors_train_like_one_process_and_meter_the_bridge(tmp_path):
    """Two one-device replicas, H100 (device 0) and MI250X (device 3) of longctx-tiny-4: the
    cross-replica sync crosses the bridge (tests/test_sequence_runtime.py has a replica whose
    ring and ZeRO-3 span both vendors); 3 steps equal one-process training. Bytes by hand (fp32,
    γ = 4): each replica's device sends its whole gradient to the other once a step,
    V·(V − 1)·P_total·4 with P_total = 2·P_layer + P_emb + P_head, P_layer = 32·(32 + 2·4·8)
    + 32² + 3·32·64 + 2·32 = 10304, P_emb = 8192, P_head = 8224 → 2·37024·4 = 296192."""
    from planner.sequence.bridge import sequence_bridge_traffic
    from runtime.sequence.worker import load_replica_params
    from test_sequence_runtime import MHA, plan_of

    cluster = load_cluster("longctx-tiny-4")
    plan = plan_of([1, 1], [[[(0, 4, 16)]], [[(3, 4, 16)]]])
    config = RunConfig(model=MHA, seq_len=16, micro_batch=1, steps=3, dump_params=True, out_dir=str(tmp_path),
                       timeout_s=60)
    result = launch_local(Job(plan=plan, config=config, cluster=cluster), echo=False)
    assert result.ok, result.failure_summary() + "\n".join(result.logs)
    ref_losses, ref_state = train_reference(config, 2)
    losses = [s["loss"] for s in result.steps]
    assert len(losses) == 3 and all(abs(a - b) <= RTOL * abs(b) for a, b in zip(losses, ref_losses)), losses
    for params in load_replica_params(tmp_path):
        assert all((params[n] - ref).norm() <= RTOL * ref.norm() for n, ref in ref_state.items())
    assert result.replicas_identical is True
    assert [s["bridge_bytes"] for s in result.steps] == [296192] * 3
    problem = Problem(cluster=cluster, model=MHA, training=TrainingSpec(
        seq_len=16, global_batch=2, micro_batch=1, token_block=8, act_bytes=4, grad_bytes=4))
    assert sequence_bridge_traffic(problem, plan).bytes_by_kind == {"ring": 0, "zero": 0, "dp": 296192}


@pytest.mark.parametrize("recompute", [False, True])
def test_a_sequence_ring_and_zero3_across_the_bridge_send_the_planners_bytes(tmp_path, recompute: bool):
    """longctx-tiny-4: replica 0 is a ring of an nvidia group (H100s, devices 0 and 1: 2 heads,
    6 and 4 tokens) and an amd group (MI250X, device 3: 4 heads, 6 tokens), m = 2; replica 1
    is the A100 (device 2, all 16 tokens), m = 1. Its ring, its ZeRO-3 and the sync cross the
    bridge; bytes per step equal planner.sequence.bridge's count, derived here by hand (fp32:
    β = γ = 4; GQA: L 2, h 32, a 4, k 2, d 8; s 16, b 1).
    Ring (both hops cross): one token row of one kv head, K and V, is b·2·d·β = 64 B. Devices
      0 and 1 hold kv head 0 and 1 and get it from device 3; device 3 gets head 0 from device 0
      and head 1 from device 1. A K/V pass brings s − T_g rows (6 into group 0, 10 into group 1),
      ρ − 1 passes a layer; the gradient pass brings all s = 16 rows (each block's gradient
      hops home at the end, module doc of planner.sequence.bridge):
      64·(2·((ρ−1)·6 + 16) + 2·((ρ−1)·10 + 16)) = 64·(32·(ρ − 1) + 64) a layer and micro-batch
      → ρ = 3: 8192, ρ = 4: 10240; × L·m = 4 → 32768 / 40960.
    ZeRO-3 over N = 3 ranks of V = 2 vendors: each unit moves 3·⌈P_u/3⌉ elements, (V − 1) times:
      P_emb 8192 → 8193, P_layer 9280 → 9282, P_head 8224 → 8226; per micro-batch the embedding
      is gathered once, a layer and the head twice (with recompute too: the recomputed forward's
      gather serves the backward), each unit reduce-scattered once:
      (4 + 4)·8193 + 2·(2·4 + 4)·9282 + (2·4 + 4)·8226 = 387024, × m = 2 → 774048.
    Sync: replica 0's third block of every unit (device 3, amd) meets device 2 (nvidia):
      P_u − 2·⌈P_u/3⌉ = 2730, 3092 (× 2 layers), 2740 → 11654 elements, V·(V − 1)·4 = 8 B each
      → 93232."""
    from planner.sequence.bridge import sequence_bridge_traffic
    from test_sequence_runtime import GQA as SEQ_GQA
    from test_sequence_runtime import plan_of

    cluster = load_cluster("longctx-tiny-4")
    plan = plan_of([2, 1], [[[(0, 2, 6), (1, 2, 4)], [(3, 4, 6)]], [[(2, 4, 16)]]])
    config = RunConfig(model=SEQ_GQA, seq_len=16, micro_batch=1, steps=2, recompute=recompute,
                       out_dir=str(tmp_path), timeout_s=60)
    result = launch_local(Job(plan=plan, config=config, cluster=cluster), echo=False)
    assert result.ok, result.failure_summary() + "\n".join(result.logs)
    ring = 40960 if recompute else 32768
    assert [s["bridge_bytes"] for s in result.steps] == [ring + 774048 + 93232] * 2
    problem = Problem(cluster=cluster, model=SEQ_GQA, training=TrainingSpec(
        seq_len=16, global_batch=3, micro_batch=1, token_block=1, act_bytes=4, grad_bytes=4, recompute=recompute))
    assert sequence_bridge_traffic(problem, plan).bytes_by_kind == {"ring": ring, "zero": 774048, "dp": 93232}
