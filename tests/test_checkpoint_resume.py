"""Plan-independent checkpoints (docs/checkpoints.md §10): save under plan A, resume under plan B with
another pipeline count, layer split and TP sizes, and continue — every step's loss and the
final parameters equal an uninterrupted one-process run (1e-5 relative, as in
test_runtime_equivalence). The save after A's last step is cut mid-write (a rank killed
while writing its shard), so B must resume from the checkpoint before it."""

from __future__ import annotations

import pytest

from planner.layered.plan import Pipeline, Plan, Stage
from planner.workload import ModelSpec
from runtime.checkpoints.manifest import complete_steps, latest_checkpoint, partial_dir
from runtime.checkpoints.manifest import CheckpointError
from runtime.config import Job, RunConfig
from runtime.failure import FailureInjection
from runtime.launch.launcher import launch_local
from runtime.model.reference import load_pipeline_params, train_reference
from runtime.launch.resume import check_fresh_dir, resume_job

RTOL = 1e-5
GQA = ModelSpec(name="gqa", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def plan_of(*pipelines) -> Plan:
    return Plan(pipelines=[Pipeline(batch=b, stages=[Stage(devices=d, layers=n) for d, n in stages])
                           for b, stages in pipelines])


# A: two pipelines, TP 2 (all 4 layers) and TP 1 (2 + 2 layers); B: one pipeline, 1 + 3
# layers on TP 1 then TP 2 — other pipeline count, layer split, TP sizes and batch split.
PLAN_A = plan_of((4, [([0, 1], 4)]), (4, [([2], 2), ([3], 2)]))
PLAN_B = plan_of((8, [([0], 1), ([1, 2], 3)]))


def config(tmp_path, name: str, **settings) -> RunConfig:
    return RunConfig(model=GQA, seq_len=8, micro_batch=2, timeout_s=30, out_dir=str(tmp_path / name),
                     checkpoint_dir=str(tmp_path / "ckpt"), **settings)


def close(values, reference) -> bool:
    return all(abs(v - r) <= RTOL * abs(r) for v, r in zip(values, reference)) and len(values) == len(reference)


def test_save_under_plan_a_resume_under_plan_b_equals_one_process(tmp_path):
    cut = FailureInjection(rank=1, step=3, mode="kill_saving")  # dies writing the step-4 checkpoint
    run_a = launch_local(Job(plan=PLAN_A, config=config(tmp_path, "a", steps=4, save_every=2)),
                         echo=False, failure=cut, end_others=True)
    assert not run_a.ok and run_a.returncodes[1] == -9
    assert complete_steps(tmp_path / "ckpt") == [2] and partial_dir(tmp_path / "ckpt", 4).is_dir()
    assert latest_checkpoint(tmp_path / "ckpt")[1].step == 2  # the cut one is skipped

    job_b, manifest = resume_job(Job(plan=PLAN_B, config=config(tmp_path, "b", steps=4, save_every=2,
                                                               dump_params=True)), tmp_path / "ckpt")
    check_fresh_dir(job_b, manifest.step)
    run_b = launch_local(job_b, echo=False)
    assert run_b.ok, run_b.failure_summary() + "\n".join(run_b.logs)

    ref_losses, ref_state = train_reference(config(tmp_path, "ref", steps=4), 8)
    losses = [s["loss"] for s in run_a.steps[:2]] + [s["loss"] for s in run_b.steps]
    assert [s["step"] for s in run_b.steps] == [3, 4]
    assert close(losses, ref_losses), (losses, ref_losses)
    (params,) = load_pipeline_params(tmp_path / "b")
    for name, ref in ref_state.items():
        assert (params[name] - ref).norm() <= RTOL * ref.norm(), name
    assert complete_steps(tmp_path / "ckpt") == [2, 4]  # B saved step 4 over the cut attempt
    assert not partial_dir(tmp_path / "ckpt", 4).exists()


def test_a_folder_without_a_manifest_where_a_save_would_go_is_refused_before_the_run(tmp_path):
    """check_fresh_dir, which every launch (the CLI and hexiscale.run_plan) passes: the save's
    rename had failed with OSError after the step was trained; a folder elsewhere is no obstacle."""
    job = Job(plan=PLAN_A, config=config(tmp_path, "a", steps=4, save_every=2))
    (tmp_path / "ckpt" / "step-00000003").mkdir(parents=True)  # not a step this run saves
    check_fresh_dir(job)
    (tmp_path / "ckpt" / "step-00000004").mkdir()
    with pytest.raises(CheckpointError, match="step-00000004: already there without a manifest"):
        check_fresh_dir(job)
