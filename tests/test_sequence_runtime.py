"""Training under sequence plans (CPU, gloo, fp32) equals the same model trained in one
process on the whole batch (`runtime.model.reference.train_reference`): per-step loss and every
parameter after 3 AdamW steps agree to 1e-5 relative, and every replica ends bit-identical.

Relative agreement of a parameter tensor is ‖run − ref‖ ≤ 1e-5·‖ref‖ per tensor, as in
tests/test_runtime_equivalence.py (element-wise error is no measure after AdamW: an entry
whose gradient is near Adam's ε moves by an amount set by its last bits).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.hardware import Cluster, Machine
from planner.problem import Problem
from planner.sequence.plan import SeqPlan
from planner.workload import ModelSpec, TrainingSpec
from runtime.config import Job, RunConfig
from runtime.errors import RunError
from runtime.failure import FailureInjection
from runtime.launch.launcher import launch_local, make_job
from runtime.model.llama import ReferenceLlama
from runtime.model.reference import train_reference
from runtime.sequence.worker import load_replica_params

RTOL = 1e-5
MHA = ModelSpec(name="mha", layers=2, hidden=32, heads=4, kv_heads=4, ffn_hidden=64, vocab=256)
GQA = ModelSpec(name="gqa", layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def plan_of(batches: list[int], rings) -> SeqPlan:
    """rings[r][g] = [(device, heads, tokens), ...]; devices numbered in plan order."""
    return SeqPlan.from_rings(problem="", batches=batches, rings=rings)


def assert_equivalent(plan: SeqPlan, tmp_path, *, model: ModelSpec = MHA, micro_batch: int = 1,
                      recompute: bool = False, cluster: Cluster | None = None) -> None:
    seq_len = plan.replicas[0].tokens
    config = RunConfig(model=model, seq_len=seq_len, micro_batch=micro_batch, steps=3, recompute=recompute,
                       dump_params=True, out_dir=str(tmp_path), timeout_s=60)
    result = launch_local(Job(plan=plan, config=config, cluster=cluster), echo=False)
    assert result.ok, result.failure_summary() + "\n".join(result.logs)
    ref_losses, ref_state = train_reference(config, sum(r.batch for r in plan.replicas))
    losses = [s["loss"] for s in result.steps]
    assert len(losses) == 3
    for loss, ref in zip(losses, ref_losses):
        assert abs(loss - ref) <= RTOL * abs(ref), (losses, ref_losses)
    initial = ReferenceLlama(model, seq_len, config.seed).full_state()
    assert all(not torch.equal(initial[n], ref) for n, ref in ref_state.items())  # every tensor trained
    replicas = load_replica_params(tmp_path)
    assert len(replicas) == len(plan.replicas)
    for params in replicas:
        assert set(params) == set(ref_state)
        for name, ref in ref_state.items():
            diff = params[name] - ref
            assert diff.norm() <= RTOL * ref.norm(), (name, float(diff.norm() / ref.norm()))
    assert result.replicas_identical is True
    members = result.steps[-1]["members"]
    assert [m["tokens"] for m in members] == [m.tokens for r in plan.replicas for g in r.ring for m in g.members]
    # the communicator timed each member's head-parallel all-to-alls (none in a one-member
    # group) and ZeRO-3 collectives (none in a one-device replica), parts of its passes
    shape = [(len(g.members), len(r.devices)) for r in plan.replicas for g in r.ring for _ in g.members]
    for m, (group_size, replica_size) in zip(members, shape):
        assert (m["hp_s"] > 0) == (group_size > 1) and (m["zero_s"] > 0) == (replica_size > 1)
        assert m["hp_s"] + m["zero_s"] < m["forward_s"] + m["backward_s"]


# (a) one group of 2 members, uneven heads (3 + 1 of 4, MHA) and tokens (12 + 4 of 16): pure
# Ulysses, ZeRO-3 over 2 ranks; 2 micro-batches of 2 accumulate.
def test_a_one_group_of_two_uneven_members(tmp_path):
    assert_equivalent(plan_of([4], [[[(0, 3, 12), (1, 1, 4)]]]), tmp_path, micro_batch=2)


# (b) a ring of 3 groups with uneven shards 2 | 6 | 8 of 16 tokens (mirrored halves 1, 3, 4),
# the middle one a 2-member group with uneven heads: ring and Ulysses together, 4 processes.
def test_b_a_ring_of_three_uneven_groups(tmp_path):
    assert_equivalent(plan_of([2], [[[(0, 4, 2)], [(1, 1, 2), (2, 3, 4)], [(3, 4, 8)]]]), tmp_path)


# (c) two replicas with batches 3:1 (3 and 1 micro-batches) and different structures — a ring
# of 2 groups over 3 ranks beside one group of 2 members — so ZeRO-3 cuts every unit into 3
# blocks in one replica and 2 in the other, and the sync meets them segment by segment.
def test_c_two_replicas_with_3_to_1_batches_and_different_structures(tmp_path):
    plan = plan_of([3, 1], [[[(0, 2, 4), (1, 2, 2)], [(2, 4, 10)]], [[(3, 1, 6), (4, 3, 10)]]])
    assert_equivalent(plan, tmp_path)


# (d) GQA (4 heads, 2 kv heads: every member holds whole kv heads) with recompute on and off.
GQA_RING = plan_of([2], [[[(0, 2, 6), (1, 2, 4)], [(2, 4, 6)]]])


@pytest.mark.parametrize("recompute", [True, False])
def test_d_gqa_ring_with_and_without_recompute(tmp_path, recompute: bool):
    assert_equivalent(GQA_RING, tmp_path, model=GQA, recompute=recompute)


def test_a_replica_spanning_nvidia_and_amd_through_the_bridge(tmp_path):
    """mixed-h100-mi300x: an H100 group of 2 (devices 0, 1) and an MI300X group (device 16) in
    one ring: ZeRO-3 over both vendors and the ring hop between them go through the
    communicator's bridge routing (issue 13); the numbers are those of one process."""
    from planner.io import load_problem

    cluster = load_problem("longctx-h100-mi300x-llama3-8b-128k").cluster
    plan = plan_of([2], [[[(0, 2, 6), (1, 2, 4)], [(16, 4, 6)]]])
    assert_equivalent(plan, tmp_path, model=GQA, cluster=cluster)


def two_machine_problem(model: ModelSpec, *, seq_len: int = 1024, global_batch: int = 2) -> Problem:
    cluster = Cluster(machines=[Machine(name="a", gpu="H100", count=2, intra_bw_gbps=400),
                                Machine(name="b", gpu="A100-80G", count=2, intra_bw_gbps=300)], inter_bw_gbps=25)
    return Problem(name="two", cluster=cluster, model=model,
                   training=TrainingSpec(seq_len=seq_len, global_batch=global_batch, micro_batch=1, token_block=64))


def test_the_tiny_job_keeps_every_share_of_heads_and_tokens():
    """longctx-tiny (s 1024 = 16 blocks of 64, a 4, k 2): shares 5+5 | 6 blocks and 16 blocks
    have no common divisor, so the tiny sequence is 16 tokens, one per block; kv shares 1, 1 |
    2 and 2 keep the model's 2 kv heads (2 query heads each, 32 hidden units)."""
    from planner.io import load_plan, load_problem

    job = make_job(load_problem("longctx-tiny"), load_plan("longctx-tiny"))
    assert job.config.seq_len == 16
    assert (job.config.model.heads, job.config.model.num_kv_heads, job.config.model.hidden) == (4, 2, 32)
    shares = [[[(m.device, m.heads, m.tokens) for m in g.members] for g in r.ring] for r in job.plan.replicas]
    assert shares == [[[(0, 2, 5), (1, 2, 5)], [(2, 4, 6)]], [[(3, 4, 16)]]]
    # s = 4096 (64 blocks), shares of 12 | 20 | 32 and 64 blocks: dividing by their common 4
    # would leave an odd shard (3 tokens), so the divisor is 2: 6 | 10 | 16 and 32 of 32 tokens
    ring = plan_of([1, 1], [[[(0, 4, 768)], [(1, 4, 1280)], [(2, 4, 2048)]], [[(3, 4, 4096)]]])
    job = make_job(two_machine_problem(GQA, seq_len=4096), ring)
    assert job.config.seq_len == 32
    assert [g.tokens for r in job.plan.replicas for g in r.ring] == [6, 10, 16, 32]
    # shares with no common divisor (192 | 320 and 255 + 257 of 512 blocks): the exact tiny
    # sequence would be 512 tokens, so it is 256 with the shares apportioned: 3:5 → 96 | 160,
    # 255:257 → 127.5 + 128.5 → 128 + 128
    coprime = plan_of([1, 1], [[[(0, 4, 192 * 64)], [(1, 4, 320 * 64)]], [[(2, 2, 255 * 64), (3, 2, 257 * 64)]]])
    job = make_job(two_machine_problem(GQA, seq_len=32768), coprime)
    assert job.config.seq_len == 256
    assert [[m.tokens for m in g.members] for r in job.plan.replicas for g in r.ring] == [[96], [160], [128, 128]]
    # a ring of 2+1 members needs 2 + 2 tokens (each member one, each shard even): 2 is refused by name
    with pytest.raises(RunError, match="seq_len 2 is too short for a ring of 2 group.*at least 4 tokens"):
        make_job(load_problem("longctx-tiny"), load_plan("longctx-tiny"), seq_len=2)


def test_a_plan_that_does_not_match_the_problem_is_refused_before_any_process(tmp_path):
    problem = two_machine_problem(GQA)
    short = plan_of([2], [[[(0, 4, 512)]]])  # 512 tokens of a 1024-token sequence
    with pytest.raises(RunError, match="invalid for this problem.*sum to 512 tokens"):
        make_job(problem, short)
    with pytest.raises(RunError, match="schedule: a sequence plan has no pipeline schedule"):
        make_job(problem, plan_of([2], [[[(0, 4, 1024)]]]), schedule="gpipe")
    (tmp_path / "p.yaml").write_text(
        "name: two\ncluster: {machines: [{name: a, gpu: H100, count: 2, intra_bw_gbps: 400}], inter_bw_gbps: 25}\n"
        "model: {name: gqa, layers: 2, hidden: 32, heads: 4, kv_heads: 2, ffn_hidden: 64, vocab: 256}\n"
        "training: {seq_len: 1024, global_batch: 2, micro_batch: 1}\n")
    (tmp_path / "short.json").write_text(short.to_json())
    from hexiscale.cli import app

    result = CliRunner().invoke(app, ["run", str(tmp_path / "p.yaml"), str(tmp_path / "short.json"),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "sum to 512 tokens" in result.output
    assert not (tmp_path / "out" / "job.json").exists()  # nothing started


def test_a_killed_rank_ends_every_other_rank_with_one_line(tmp_path):
    """Rank 2 (the ring's second group) dies mid-step 1, after one forward: the 2-member group
    waits on it in the ring exchange and the ZeRO-3 collectives."""
    config = RunConfig(model=GQA, seq_len=16, micro_batch=1, steps=3, timeout_s=20, out_dir=str(tmp_path))
    result = launch_local(Job(plan=GQA_RING, config=config), echo=False,
                          failure=FailureInjection(rank=2, step=1, mode="kill"))
    assert result.returncodes[2] == -9
    for rank in (0, 1):
        assert result.returncodes[rank] == 1, result.logs[rank]
        assert result.exit_s[rank] - result.exit_s[2] < 60, result.exit_s
        lines = [ln for ln in result.logs[rank].splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and re.match(rf"error: rank {rank} \(replica \d+, group \d+, member \d+\): "
                                            r"stopping after a failure", lines[0]), result.logs[rank]
    assert "killed by signal 9" in result.failure_summary()



def test_torchrun_prints_one_command_per_machine_and_workers_find_their_rank(tmp_path, monkeypatch):
    """longctx-tiny: devices 0, 1 on machine 0, device 2 on machine 1, device 3 on machine 2."""
    from hexiscale.cli import app
    from runtime.sequence.worker import plan_rank

    result = CliRunner().invoke(app, ["run", "longctx-tiny", "longctx-tiny", "--torchrun", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    commands = [ln for ln in result.output.splitlines() if "torchrun" in ln and "--node-rank" in ln]
    assert [c.split("--nproc-per-node=")[1].split()[0] for c in commands] == ["2", "1", "1"]
    job = Job.model_validate_json((tmp_path / "job.json").read_text())
    assert job.kind == "sequence" and job.config.seq_len == 16
    for (machine, local), rank in {(0, 0): 0, (0, 1): 1, (1, 0): 2, (2, 0): 3}.items():
        monkeypatch.setenv("LOCAL_RANK", str(local))
        assert plan_rank(job, machine) == rank


@pytest.mark.parametrize("recompute", [False, True])
def test_zero3_gathers_every_unit_again_for_backward(monkeypatch, recompute: bool):
    """One process as a 1-rank ZeRO-3 group (so every gather and reduce-scatter runs): the
    forward pass gathers the L+2 units once each; backward gathers the L layers and the head
    again (re-gathered by the saved-tensor hook, or by checkpoint's recomputed forward: the
    forward's gathered weights are not kept), never the embedding (its backward needs no
    weight), and reduce-scatters each unit's gradient once. The gradients equal the
    one-process model's."""
    import numpy as np

    from runtime.communication.communicator import Communicator, RankPlace
    from runtime.model.data import BatchLoader, make_source
    from runtime.launch.launcher import free_port
    from runtime.model.llama import causal_attention
    from runtime.sequence.member import MemberModel
    from runtime.sequence.shards import unit_catalogues
    from runtime.sequence.zero import ZeroStates

    calls = {"all_gather": 0, "reduce_scatter": 0}
    for name in calls:
        def counted(self, *args, _name=name, _method=getattr(Communicator, name), **kwargs):
            calls[_name] += 1
            return _method(self, *args, **kwargs)
        monkeypatch.setattr(Communicator, name, counted)
    comm = Communicator.start("gloo", "127.0.0.1", free_port(), 0, 1, (RankPlace(device=0),), 30.0,
                              torch.device("cpu"))
    try:
        states = ZeroStates(unit_catalogues(MHA), seed=0, comm=comm, group=comm.new_group((0,)), index=0)
        model = MemberModel(MHA, states, causal_attention, positions=np.arange(8), seq_len=8, recompute=recompute)
        tokens, labels = BatchLoader(make_source("synthetic", 256, 0), 8).batch(0, 0, 2)
        loss = model(tokens, labels, 1 / 16)
        assert calls == {"all_gather": MHA.layers + 2, "reduce_scatter": 0}
        loss.backward()
        assert calls == {"all_gather": 2 * MHA.layers + 3, "reduce_scatter": MHA.layers + 2}
        assert states.regathered == {}  # dropped once each unit's gradient was scattered
    finally:
        comm.close()
    reference = ReferenceLlama(MHA, 8, 0)
    reference(tokens, labels).backward()
    for unit, catalogue in enumerate(states.catalogues):
        for name, (shape, (start, stop)) in catalogue.params.items():
            expected = reference.p(name).grad
            assert torch.allclose(states.blocks[unit].grad[start:stop].view(shape), expected, rtol=1e-5, atol=1e-7)


def test_checkpoints_pass_between_sequence_and_layered_plans(tmp_path):
    """Steps 1–2 under a 2-member group (ZeRO-3 blocks cut across rows), saved; steps 3–4
    resumed under a layered TP-2 plan, saved; step 5 resumed under a ring of 2 groups: every
    loss and the final parameters equal 5 steps of one-process training."""
    from planner.layered.plan import Pipeline, Plan, Stage
    from runtime.launch.resume import resume_job

    config = RunConfig(model=GQA, seq_len=16, micro_batch=2, steps=2, save_every=2, timeout_s=60)
    runs = [(plan_of([4], [[[(0, 2, 10), (1, 2, 6)]]]), 2, "sequence"),
            (Plan(pipelines=[Pipeline(batch=4, stages=[Stage(devices=[0, 1], layers=2)])]), 4, "layered"),
            (plan_of([4], [[[(0, 4, 6)], [(1, 4, 10)]]]), 5, "sequence")]
    losses = []
    for index, (plan, steps, kind) in enumerate(runs):
        settings = {"steps": steps, "out_dir": str(tmp_path / f"out{index}"),
                    "checkpoint_dir": str(tmp_path / f"ck{index}"), "dump_params": index == 2}
        job = Job(plan=plan, config=config.model_copy(update=settings))
        if index:
            job, manifest = resume_job(job, tmp_path / f"ck{index - 1}")
            assert manifest.plan_kind == runs[index - 1][2]
        result = launch_local(job, echo=False)
        assert result.ok, result.failure_summary() + "\n".join(result.logs)
        losses += [s["loss"] for s in result.steps]
    ref_losses, ref_state = train_reference(config.model_copy(update={"steps": 5}), 4)
    assert len(losses) == 5
    for loss, ref in zip(losses, ref_losses):
        assert abs(loss - ref) <= RTOL * abs(ref), (losses, ref_losses)
    (params,) = load_replica_params(tmp_path / "out2")
    for name, ref in ref_state.items():
        assert (params[name] - ref).norm() <= RTOL * ref.norm(), name


@pytest.mark.slow
def test_cli_runs_a_sequence_plan_and_prints_every_member(tmp_path):
    from hexiscale.cli import app

    result = CliRunner().invoke(app, ["run", "longctx-tiny", "longctx-tiny", "--steps", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "per-member times" in result.output and "replicas identical: True" in result.output
    assert "replica T_mb per micro-batch" in " ".join(result.output.split())  # predicted against measured
    from runtime.metrics.runlog import read_run_log

    record = read_run_log(tmp_path / "runlog.json").record("cli")
    assert len(record.stage_s) == 2 and 0 < record.step_s  # one figure per replica, then the step
    rows = [ln.split("│")[1:6] for ln in result.output.splitlines() if ln.count("│") == 10]  # 9 columns
    assert [[c.strip() for c in row] for row in rows] == [["0", "0", "0", "0", "5"], ["0", "0", "1", "1", "5"],
                                                          ["0", "1", "0", "2", "6"], ["1", "0", "0", "3", "16"]]
    import hexiscale as hx

    api = hx.run_plan(hx.load_problem("longctx-tiny"), hx.load_plan("longctx-tiny"), steps=1, echo=False)
    cli_steps = json.loads((tmp_path / "metrics.json").read_text())["steps"]
    assert api.steps[0]["loss"] == cli_steps[0]["loss"]  # the same job either way, bit for bit


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 300), replica_sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4))
def test_sync_segments_tile_every_unit_with_one_owner_per_replica(size: int, replica_sizes: list[int]):
    """Brute force: element e of a unit belongs to block ⌊e/c_r⌋ of replica r; the segments
    tile [0, size) in order and name exactly those owners."""
    from runtime.sequence.shards import block_size, sync_segments

    ranks, first = [], 0
    for n in replica_sizes:
        ranks.append(tuple(range(first, first + n)))
        first += n
    segments = sync_segments([size], ranks)
    assert [e for s in segments for e in range(*s.span)] == list(range(size))
    for s in segments:
        for e in range(*s.span):
            assert s.owners == tuple(r[e // block_size(size, len(r))] for r in ranks)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 6), data=st.data())
def test_a_block_range_is_at_most_three_rectangles_of_the_tensor(rows: int, cols: int, data):
    from runtime.sequence.checkpoint import flat_regions

    start = data.draw(st.integers(0, rows * cols - 1))
    stop = data.draw(st.integers(start + 1, rows * cols))
    full = torch.arange(rows * cols).view(rows, cols)
    regions = flat_regions((rows, cols), start, stop)
    pieces = [full[r:r + h, c:c + w].flatten() for (r, c), (h, w), _, _ in regions]
    assert len(regions) <= 3 and torch.equal(torch.cat(pieces), torch.arange(start, stop))


def test_a_world_that_differs_from_the_plan_stops_every_rank_with_one_line():
    config = RunConfig(model=GQA, seq_len=16, micro_batch=1, steps=1)
    result = launch_local(Job(plan=GQA_RING, config=config), echo=False, world_size=2)
    assert result.returncodes == [2, 2]
    for rank, log in enumerate(result.logs):
        lines = [ln for ln in log.splitlines() if ln.startswith("error:")]
        assert lines == [f"error: rank {rank}: the plan uses 3 devices (one process each) but the world has 2 processes"]
