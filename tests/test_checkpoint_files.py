"""Checkpoint files without starting a run: regions read back from uneven chunks; a cut
checkpoint (partial folder) is skipped for the previous one; a missing or damaged shard or
manifest is one line naming the file, exit 2, and nothing in the folder changes; a fresh
run refuses a folder that already holds checkpoints."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import load_plan, load_problem
from runtime.checkpoints.manifest import (Chunk, CheckpointError, Manifest, TensorEntry, commit, latest_checkpoint,
                                partial_dir, step_dir)
from runtime.checkpoints.tensors import ShardReader, write_shard
from runtime.launch.launcher import make_job
from runtime.layered.checkpoint import build_manifest, rank_regions
from runtime.layered.layout import rank_layout


def fake_checkpoint(root, step: int) -> None:
    """A complete checkpoint of demo-tiny's plan, as its ranks would write it (values: zeros)."""
    job = make_job(load_problem("demo-tiny"), load_plan("demo-tiny"), "tiny", seq_len=16)
    layout = rank_layout(job.plan)
    for rank in range(layout.world_size):
        tensors = {f"{kind}/{name}": torch.zeros(sizes) for name, _, sizes in rank_regions(layout, job.config.model, rank)
                   for kind in ("param", "adam_m", "adam_v")}
        if tensors:
            write_shard(root, step, rank, tensors)
    commit(root, build_manifest(job, layout, step))


def snapshot(root) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def resume(root, *extra):
    return CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--steps", "3", "--seq-len", "16",
                                    "--resume", str(root), "--save-every", "1", *extra])


def test_region_is_assembled_from_uneven_chunks(tmp_path):
    full = torch.arange(24.0).view(6, 4)
    write_shard(tmp_path, 1, 0, {"a": full[:4]})
    write_shard(tmp_path, 1, 1, {"b": full[4:]})
    chunks = (Chunk(file="rank0.pt", key="a", offsets=(0, 0), sizes=(4, 4)),
              Chunk(file="rank1.pt", key="b", offsets=(4, 0), sizes=(2, 4)))
    manifest = Manifest(step=1, data_position=1, sequences_seen=1, plan_kind="layered", plan={},
                        model=load_problem("demo-tiny").model, settings={},
                        tensors={"t": TensorEntry(shape=(6, 4), chunks=chunks)})
    reader = ShardReader(partial_dir(tmp_path, 1), manifest)
    assert torch.equal(reader.region("t", (3, 0), (3, 4)), full[3:])  # spans both chunks
    assert torch.equal(reader.region("t", (0, 2), (6, 2)), full[:, 2:])
    with pytest.raises(CheckpointError, match="no tensor 'u'"):
        reader.region("u", (0,), (1,))


def test_a_cut_checkpoint_is_skipped_for_the_previous_one(tmp_path):
    fake_checkpoint(tmp_path, 2)
    (partial_dir(tmp_path, 4)).mkdir()
    (partial_dir(tmp_path, 4) / "rank0.pt").write_bytes(bytes(100))  # cut mid-write
    step_dir(tmp_path, 6).mkdir()  # a folder without manifest is not a checkpoint either
    folder, manifest = latest_checkpoint(tmp_path)
    assert manifest.step == 2 and folder == step_dir(tmp_path, 2)


def damage_size(folder):
    with open(folder / "rank1.pt", "ab") as handle:
        handle.write(b"x")


def damage_bytes(folder):
    path = folder / "rank1.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (damage_size, "rank1.pt: shard has"), (damage_bytes, "rank1.pt: shard checksum differs"),
    (lambda f: os.remove(f / "rank2.pt"), "rank2.pt: shard file missing"),
    (lambda f: (f / "manifest.json").write_text("{not json"), "manifest.json: not a readable checkpoint manifest")])
def test_a_damaged_checkpoint_is_one_line_exit_2_and_nothing_changes(tmp_path, damage, message):
    fake_checkpoint(tmp_path, 2)
    damage(step_dir(tmp_path, 2))
    before = snapshot(tmp_path)
    result = resume(tmp_path)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert snapshot(tmp_path) == before


def test_a_fresh_run_refuses_a_folder_with_checkpoints(tmp_path):
    fake_checkpoint(tmp_path, 2)
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--checkpoint-dir", str(tmp_path),
                                      "--save-every", "1"])
    assert result.exit_code == 2 and "already holds checkpoints (up to step 2)" in result.output


@pytest.mark.parametrize("args, message", [
    (["--save-every", "2"], "--save-every needs --checkpoint-dir"),
    (["--checkpoint-dir", "/tmp"], "--checkpoint-dir saves nothing without --save-every N"),
    (["--elastic"], "--elastic needs --checkpoint-dir and --save-every"),
    (["--resume", "/nonexistent/x"], "--resume: /nonexistent/x is not a folder")])
def test_checkpoint_options_are_checked_first(args, message):
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_resume_past_the_requested_steps_says_so(tmp_path):
    fake_checkpoint(tmp_path, 3)
    result = resume(tmp_path)
    assert result.exit_code == 2 and "leaves nothing to run" in result.output
    shutil.rmtree(tmp_path)


def test_run_plan_resume_checks_the_checkpoint_before_starting(tmp_path):
    import hexiscale as hx

    fake_checkpoint(tmp_path, 2)
    damage_bytes(step_dir(tmp_path, 2))
    with pytest.raises(CheckpointError, match="rank1.pt: shard checksum differs"):
        hx.run_plan(load_problem("demo-tiny"), load_plan("demo-tiny"), steps=3, seq_len=16, resume=tmp_path)
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        hx.run_plan(load_problem("demo-tiny"), load_plan("demo-tiny"), steps=3, checkpoint_dir=str(tmp_path))


def test_saved_steps_are_every_save_every_th_after_the_start_at_any_size():
    """As the workers save (after step s when s % save_every == 0), without a loop over the
    steps: --steps 10^13 had spent 10 silent minutes listing them before the run began."""
    from runtime.checkpoints.manifest import saved_steps

    for first in range(0, 9):
        for steps in range(first, 14):
            for every in range(0, 5):
                listed = [s for s in range(first + 1, steps + 1) if every and s % every == 0]
                assert list(saved_steps(first, steps, every)) == listed, (first, steps, every)
    huge = saved_steps(3, 10**13, 1)
    assert len(huge) == 10**13 - 3 and huge[-1] == 10**13 and 10**12 in huge and 3 not in huge


def test_a_damaged_newest_checkpoint_is_named_with_the_command_of_its_reader_and_a_bad_manifest_field(tmp_path):
    """export-hf suggested `--resume`, an option of run; an empty manifest said 'Field required'
    without the field."""
    from runtime.checkpoints.hf_weights import export_checkpoint

    fake_checkpoint(tmp_path, 1)
    fake_checkpoint(tmp_path, 2)
    os.remove(step_dir(tmp_path, 2) / "rank2.pt")
    older = step_dir(tmp_path, 1)
    with pytest.raises(CheckpointError, match=re.escape(f"can be exported by naming it (hexiscale export-hf {older} -o")):
        export_checkpoint(tmp_path, tmp_path / "hf")
    (older / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"not a readable checkpoint manifest \(\w+: Field required\)"):
        latest_checkpoint(older)
