"""The runtime as the cost model prices it (issue 31; CPU, gloo): ZeRO-1 across asymmetric
pipelines (docs/checkpoints.md §11), sequence parallelism in TP stages (docs/cost-model.md
§3.5) and bf16 mixed precision (docs/models-and-data.md §12).

- fp32 with `zero_stage: 1` and `sequence_parallel`: every step's loss and the final
  parameters equal the one-process run to 1e-5 (‖Δ‖/‖ref‖ over all tensors) on plans with
  uneven TP across pipelines, D = 3, NVIDIA and AMD ranks, GPipe with tied embeddings; on the
  first, also the same plan run without them.
- Memory: each rank's bytes of weights, gradients and optimizer state, counted from its
  tensors, are §3.5's W_σ with §11's μ_σ exactly — plus, on TP stages, the norm weights every
  TP rank keeps whole where W_σ splits them by t (the term is spelled out below).
- Checkpoints: saved under ZeRO-1, resumed under zero_stage 0 and another plan, saved, and
  resumed under ZeRO-1 and a third plan: the four losses equal the one-process run's.
- bf16: 50 steps under an asymmetric plan stay within 2 % of the fp32 run's loss after the
  5th step and within 1e-2 of the one-process bf16 run.
"""

from __future__ import annotations

import pytest
import torch

from planner.io import load_cluster, load_plan
from planner.layered.cost import state_bytes_per_param
from planner.layered.plan import Pipeline, Plan, Stage
from planner.workload import ModelSpec, TrainingSpec
from runtime.checkpoints.manifest import read_manifest, step_dir
from runtime.config import Job, RunConfig
from runtime.launch.launcher import launch_local
from runtime.launch.resume import resume_job
from runtime.layered.layout import rank_layout
from runtime.model.reference import load_pipeline_params, train_reference
from runtime.precision import SCHEMES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

RTOL = 1e-5
GQA = ModelSpec(name="gqa", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)
TIED = GQA.model_copy(update={"tied_embeddings": True, "qkv_bias": True})
BOTH = {"zero_stage": 1, "sequence_parallel": True}


def plan_of(*pipelines) -> Plan:
    return Plan(pipelines=[Pipeline(batch=b, stages=[Stage(devices=d, layers=n) for d, n in stages])
                           for b, stages in pipelines])


# TP 2 (3 layers) + TP 1 | TP 1 (2 layers) + TP 2, batches 6:2: every layer's chunks meet
# another TP size, the boundaries go TP 2 → 1 and 1 → 2 (split form both ways)
MIXED = plan_of((6, [([0, 1], 3), ([2], 1)]), (2, [([3], 2), ([4, 5], 2)]))
# D = 3: TP 2 | TP 1 | TP 1 + TP 2 hold the same layers; buckets of n not divisible by 3
THREE = plan_of((4, [([0, 1], 4)]), (2, [([2], 4)]), (2, [([3], 2), ([4, 5], 2)]))
# GPipe, three stages TP 2 → 1 → 2 beside a one-stage pipeline (its embedding and head on one rank)
GPIPE = plan_of((4, [([0, 1], 2), ([2], 1), ([3, 4], 1)]), (4, [([5], 4)]))


def train(plan: Plan, out, cluster=None, **settings):
    settings = {"model": GQA, "seq_len": 16, "micro_batch": 2, "steps": 3, **settings}
    config = RunConfig(dump_params=True, out_dir=str(out), timeout_s=60, **settings)
    result = launch_local(Job(plan=plan, config=config, cluster=cluster), echo=False)
    assert result.ok, result.failure_summary() + "\n".join(result.logs)
    return result, config


def relative_distance(params: dict, reference: dict) -> float:
    delta = sum(float((params[name] - ref).norm() ** 2) for name, ref in reference.items())
    return (delta / sum(float(ref.norm() ** 2) for ref in reference.values())) ** 0.5


def assert_equals_one_process(result, config, out, global_batch: int = 8) -> list[dict]:
    ref_losses, ref_state = train_reference(config, global_batch)
    losses = [s["loss"] for s in result.steps]
    assert len(losses) == config.steps and ref_losses[-1] < ref_losses[0]
    assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    pipelines = load_pipeline_params(out)
    for params in pipelines:
        assert relative_distance(params, ref_state) <= RTOL
        assert all(torch.equal(params[n], pipelines[0][n]) for n in ref_state)  # replicas, bit for bit
    assert result.replicas_identical is True
    return pipelines


def expected_held_bytes(spec: ModelSpec, plan: Plan, rank: int, precision: str, zero_stage: int) -> int:
    """§3.5's W_σ = μ_σ·(n·P_layer + [first]·P_emb + [last]·P_head)/t with §11's μ_σ (the
    planner's own function), plus the norm weights a TP rank keeps whole: W_σ prices their
    N = n·2h + [last]·h elements split by t; each rank holds them whole with their gradients,
    and their moments (masters) too — under ZeRO-1 only on the TP leader, which owns chunk 0,
    in its 1/D share."""
    layout = rank_layout(plan)
    stage, pipelines = layout.stage_of(rank), layout.num_pipelines
    scheme = SCHEMES[precision]
    training = TrainingSpec(seq_len=16, global_batch=8, param_state_bytes=scheme.param_state_bytes,
                            weight_bytes=scheme.weight_bytes, optimizer_bytes=scheme.optimizer_bytes,
                            zero_stage=zero_stage)
    n, t = stage.layer_end - stage.layer_start, stage.tp
    params = n * spec.params_per_layer + stage.first * spec.params_embedding + stage.last * spec.params_head
    w_sigma = float(state_bytes_per_param(training, pipelines)) * params / t
    norms = n * 2 * spec.hidden + stage.last * spec.hidden
    sharded = zero_stage == 1 and pipelines >= 2
    leader = rank == stage.leader
    optimizer = scheme.optimizer_bytes * norms * ((leader / pipelines - 1 / (t * pipelines)) if sharded else 1 - 1 / t)
    return round(w_sigma + (scheme.weight_bytes + scheme.grad_bytes) * norms * (1 - 1 / t) + optimizer)


def assert_memory_is_priced(out, spec: ModelSpec, plan: Plan, precision: str, zero_stage: int) -> None:
    scheme = SCHEMES[precision]
    for rank in range(rank_layout(plan).world_size):
        held = torch.load(out / f"rank{rank}.pt")["held_bytes"]
        assert held["weights"] * scheme.grad_bytes == held["gradients"] * scheme.weight_bytes
        assert sum(held.values()) == expected_held_bytes(spec, plan, rank, precision, zero_stage), (rank, held)


def test_uneven_tp_with_zero1_and_sequence_parallel_equals_the_plain_plan_and_one_process(tmp_path):
    result, config = train(MIXED, tmp_path / "both", schedule="1f1b", recompute=True, **BOTH)
    both = assert_equals_one_process(result, config, tmp_path / "both")
    plain, plain_config = train(MIXED, tmp_path / "plain", schedule="1f1b", recompute=True)
    assert all(abs(a["loss"] - b["loss"]) <= RTOL * b["loss"] for a, b in zip(result.steps, plain.steps))
    assert relative_distance(both[0], load_pipeline_params(tmp_path / "plain")[0]) <= RTOL
    assert_memory_is_priced(tmp_path / "both", GQA, MIXED, "fp32", zero_stage=1)
    assert_memory_is_priced(tmp_path / "plain", GQA, MIXED, "fp32", zero_stage=0)
    # ZeRO-1 halves (D = 2) every t = 1 rank's moments: 8 of μ = 16 bytes per parameter → 4
    held = [torch.load(tmp_path / name / "rank2.pt")["held_bytes"] for name in ("both", "plain")]
    assert held[0]["optimizer"] * 2 == held[1]["optimizer"] and held[0]["weights"] == held[1]["weights"]


def test_three_pipelines_split_their_moments_in_thirds(tmp_path):
    result, config = train(THREE, tmp_path, **BOTH)
    assert_equals_one_process(result, config, tmp_path)
    held = {rank: torch.load(tmp_path / f"rank{rank}.pt")["held_bytes"]["optimizer"] for rank in range(6)}
    # rank 2 (pipeline 1, TP 1, all 4 layers) keeps ⌈n/3⌉ or fewer of each bucket's moments
    full = 8 * (4 * GQA.params_per_layer + GQA.params_embedding + GQA.params_head)
    assert full / 3 - 8 * 16 <= held[2] <= full / 3 + 8 * 16


def test_nvidia_and_amd_ranks_reduce_scatter_and_gather_over_the_bridge(tmp_path):
    cluster, plan = load_cluster("tiny-mixed-4"), load_plan("tiny-mixed-4")
    result, config = train(plan, tmp_path, cluster=cluster, recompute=True, **BOTH)
    assert_equals_one_process(result, config, tmp_path)
    # §11: a reduce-scatter and an all-gather move what the all-reduce did when γ = μ_w (fp32:
    # 4 and 4), and the split boundaries' halves add up to the activation: the same bytes per
    # step as tests/test_vendor_runtime.py's plain run, 32768 (PP) + 428288 (DP)
    assert [s["bridge_bytes"] for s in result.steps] == [32768 + 428288] * 3


def test_gpipe_with_tied_embeddings_under_zero1_and_sequence_parallel(tmp_path):
    result, config = train(GPIPE, tmp_path, model=TIED, schedule="gpipe", **BOTH)
    assert_equals_one_process(result, config, tmp_path)
    assert_memory_is_priced(tmp_path, TIED, GPIPE, "fp32", zero_stage=1)


def test_zero1_checkpoint_resumes_under_zero0_and_another_plan_and_back(tmp_path):
    plans = [MIXED, plan_of((8, [([0], 1), ([1, 2], 3)])), plan_of((4, [([0, 1], 4)]), (4, [([2], 2), ([3], 2)]))]
    zero_stages, losses = [1, 0, 1], []

    def settings(name: str, steps: int, zero: int) -> RunConfig:
        return RunConfig(model=TIED, seq_len=8, micro_batch=2, steps=steps, save_every=1, zero_stage=zero,
                         sequence_parallel=True, timeout_s=60, out_dir=str(tmp_path / name),
                         checkpoint_dir=str(tmp_path / "ckpt"), dump_params=True)

    for index, (plan, zero) in enumerate(zip(plans, zero_stages)):
        job = Job(plan=plan, config=settings(f"run{index}", 2 + index, zero))
        if index:
            job, _ = resume_job(job, tmp_path / "ckpt")
        result = launch_local(job, echo=False)
        assert result.ok, result.failure_summary() + "\n".join(result.logs)
        losses += [s["loss"] for s in result.steps]
    assert read_manifest(step_dir(tmp_path / "ckpt", 2)).settings["zero_stage"] == 1
    ref_losses, ref_state = train_reference(settings("ref", 4, 0), 8)
    assert len(losses) == 4 and all(abs(a - b) <= RTOL * abs(b) for a, b in zip(losses, ref_losses)), losses
    for params in load_pipeline_params(tmp_path / "run2"):
        assert relative_distance(params, ref_state) <= RTOL


def test_bf16_fifty_steps_follow_fp32_and_the_one_process_bf16_run(tmp_path):
    result, config = train(MIXED, tmp_path, precision="bf16", steps=50, data="corpus", **BOTH)
    losses = [s["loss"] for s in result.steps]
    fp32, _ = train_reference(config.model_copy(update={"precision": "fp32"}), 8)
    bf16, _ = train_reference(config, 8)
    assert fp32[-1] < 0.8 * fp32[0]  # it learns
    assert all(abs(a - b) <= 0.02 * b for a, b in list(zip(losses, fp32))[5:]), max(
        abs(a - b) / b for a, b in zip(losses, fp32))
    assert all(abs(a - b) <= 1e-2 for a, b in zip(losses, bf16)), max(abs(a - b) for a, b in zip(losses, bf16))
    assert_memory_is_priced(tmp_path, GQA, MIXED, "bf16", zero_stage=1)
    assert "precision bf16: bf16 weights" in result.logs[0]
