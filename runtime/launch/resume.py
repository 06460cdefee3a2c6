"""Starting a job from a checkpoint (no torch): find the newest complete checkpoint, verify
every shard, and point the job at it with the checkpoint's model; refuse a fresh run that
would write over existing checkpoints."""

from __future__ import annotations

from pathlib import Path

from runtime.checkpoints.manifest import (CheckpointError, Manifest, check_resumable, complete_steps, incomplete_steps,
                                          latest_checkpoint, saved_steps, step_dir)
from runtime.config import Job
from runtime.errors import RunError
from runtime.kinds import runtime_kind


def job_settings(job: Job) -> dict:
    config = job.config
    return {"seq_len": config.seq_len, "seed": config.seed, "data": config.data_id,
            "global_batch": job.plan.global_batch}


def resume_job(job: Job, checkpoint: str | Path) -> tuple[Job, Manifest]:
    """`job` started from the newest complete checkpoint under `checkpoint` (or that one
    checkpoint folder): its shards verified, its model (whatever the plan that wrote it)
    split by this plan's TP sizes. Raises CheckpointError naming the bad file."""
    folder, manifest = latest_checkpoint(checkpoint)
    try:  # the kind's own rule (TP sizes, or head shares) for splitting another model
        job = runtime_kind(job.kind).with_model(job, manifest.model)
    except (ValueError, RunError) as exc:
        raise CheckpointError(f"{folder}: this plan cannot split the checkpoint's model: {exc}") from None
    check_resumable(manifest, folder, manifest.model, job_settings(job))
    if manifest.step >= job.config.steps:
        raise CheckpointError(f"{folder}: the checkpoint is at step {manifest.step}; "
                              f"--steps {job.config.steps} leaves nothing to run")
    config = job.config.model_copy(update={"resume_from": str(folder)})
    return job.model_copy(update={"config": config}), manifest


def check_fresh_dir(job: Job, resumed_step: int | None = None) -> None:
    """A run must not write where checkpoints newer than its start already are."""
    root = job.config.checkpoint_dir
    steps = complete_steps(root) if root else []
    if steps and resumed_step is None:
        raise CheckpointError(f"{root}: already holds checkpoints (up to step {steps[-1]}); "
                              f"resume from it (--resume {root}) or choose another folder")
    if steps and steps[-1] > (resumed_step or 0):
        raise CheckpointError(f"{root}: holds a checkpoint (step {steps[-1]}) newer than the one "
                              f"resumed (step {resumed_step}); it would be overwritten")
    config = job.config
    saves = saved_steps(resumed_step or 0, config.steps, config.save_every)
    for step in incomplete_steps(root) if root else ():
        # a folder without a manifest (deleted, made by hand) where a save would go: the save's
        # rename cannot replace it, and it is not this run's to remove
        if step in saves and (there := step_dir(root, step)).exists():
            raise CheckpointError(f"{there}: already there without a manifest, where this run would save step {step}: "
                                  f"move it aside or remove it, or choose another --checkpoint-dir")
