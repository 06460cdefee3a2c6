"""From a QA pass of runs, checkpoints and printed torchrun commands: a checkpoint is only
committed whole (a folder not shared across machines is refused, and a step folder already
there); folders without a manifest are said and never collided with; a manifest whose step
or chunks were edited is refused before any process; a damaged newest checkpoint names the
older one; --timeout and --master-addr are checked before anything starts; an earlier run's
files in the output folder are removed and said; the save schedule, the torch build and a
Ctrl-C are said."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import load_plan, load_problem
from runtime.checkpoints.manifest import (CheckpointError, commit, latest_checkpoint, partial_dir, read_manifest,
                                          step_dir, tiling_error)
from runtime.launch.launcher import RunResult, make_job
from test_checkpoint_files import fake_checkpoint, snapshot
from terminal import terminal_popen
from test_runtime_launch import descendants, running

ROOT = Path(__file__).resolve().parents[1]
TWO_RANKS = {"format": "hexiscale.plan/1", "problem": "demo-tiny",  # one pipeline, two stages: 2 processes
             "pipelines": [{"batch": 8, "stages": [{"devices": [0], "layers": 1}, {"devices": [1], "layers": 3}]}]}


def cli(*args):
    return CliRunner().invoke(app, ["run", *map(str, args)])


def error_lines(result) -> list[str]:
    return [ln for ln in result.output.splitlines() if ln.startswith("error:")]


def two_rank_plan(folder: Path) -> Path:
    path = folder / "two.json"
    path.write_text(json.dumps(TWO_RANKS))
    return path


def edit_manifest(folder: Path, edit) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


# finding 1: a checkpoint folder that machines do not share


def test_commit_refuses_a_checkpoint_missing_a_file_its_chunks_name(tmp_path):
    fake_checkpoint(tmp_path / "whole", 1)  # ranks 0, 1 and 2 write (pipeline 0 of demo-tiny)
    manifest = read_manifest(step_dir(tmp_path / "whole", 1))
    partial = partial_dir(tmp_path / "ck", 1)
    partial.mkdir(parents=True)
    for name in ("rank0.pt", "rank1.pt"):  # rank2.pt went to machine 1's own folder
        shutil.copy(step_dir(tmp_path / "whole", 1) / name, partial / name)
    with pytest.raises(CheckpointError, match=r"rank2.pt missing.*one folder shared by every machine"):
        commit(tmp_path / "ck", manifest)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [partial.name]  # nothing committed
    assert sorted(p.name for p in partial.iterdir()) == ["rank0.pt", "rank1.pt"]


@pytest.mark.slow
def test_two_machines_with_their_own_checkpoint_folders_fail_and_commit_nothing(tmp_path, monkeypatch):
    """The printed commands run as two torchrun "machines", each in its own folder, so that the
    relative --checkpoint-dir is a different folder on each: machine 0's rank 0 must not commit
    a checkpoint without rank 2's file."""
    machines = [tmp_path / "m0", tmp_path / "m1"]
    for folder in machines:
        folder.mkdir()
    monkeypatch.chdir(machines[0])
    printed = cli("demo-tiny", "demo-tiny", "--steps", 1, "--seq-len", 8, "--checkpoint-dir", "ck", "--save-every", 1,
                  "--timeout", 30, "--torchrun", "--master-addr", "127.0.0.1", "--out", tmp_path / "out")
    assert printed.exit_code == 0, printed.output
    assert "--checkpoint-dir ck must be one folder shared by every machine, at the same path on each" in printed.output
    commands = [ln for ln in printed.output.splitlines() if ln.startswith("python -m runtime.launch.torchrun ")]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, *shlex.split(c)[1:]], cwd=folder, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c, folder in zip(commands, machines)]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0, outputs
    assert "CheckpointError" in outputs[0] and "rank2.pt missing" in outputs[0], outputs[0]
    assert "saved checkpoint" not in outputs[0]
    assert not step_dir(machines[0] / "ck", 1).exists() and not step_dir(machines[1] / "ck", 1).exists()


def test_torchrun_says_the_checkpoint_folder_is_shared_only_when_there_is_one(tmp_path):
    plain = cli("demo-tiny", "demo-tiny", "--torchrun", "--out", tmp_path / "a")
    assert plain.exit_code == 0 and "shared by every machine" not in plain.output


# finding 2: step folders without a manifest


def test_a_resumed_run_names_the_folder_it_passes_over_and_refuses_to_save_onto_it(tmp_path):
    fake_checkpoint(tmp_path, 1)
    fake_checkpoint(tmp_path, 2)
    os.remove(step_dir(tmp_path, 2) / "manifest.json")
    before = snapshot(tmp_path)
    result = cli("demo-tiny", "demo-tiny", "--steps", 3, "--seq-len", 16, "--resume", tmp_path, "--save-every", 1)
    assert result.exit_code == 2, result.output
    assert f"note: passing over {step_dir(tmp_path, 2)}: no manifest.json in it" in result.output
    assert error_lines(result) == [f"error: {step_dir(tmp_path, 2)}: already there without a manifest, where this "
                                   f"run would save step 2: move it aside or remove it, or choose another "
                                   f"--checkpoint-dir"]
    assert snapshot(tmp_path) == before


def test_a_fresh_run_refuses_a_leftover_where_it_saves_and_names_one_it_does_not(tmp_path):
    step_dir(tmp_path, 2).mkdir()  # a checkpoint whose manifest was removed
    (step_dir(tmp_path, 2) / "rank0.pt").write_bytes(b"x")
    refused = cli("demo-tiny", "demo-tiny", "--steps", 3, "--checkpoint-dir", tmp_path, "--save-every", 2,
                  "--torchrun", "--out", tmp_path / "job")
    assert refused.exit_code == 2 and "step-00000002: already there without a manifest" in refused.output
    assert not (tmp_path / "job" / "job.json").exists()
    passed = cli("demo-tiny", "demo-tiny", "--steps", 3, "--checkpoint-dir", tmp_path, "--save-every", 3,
                 "--torchrun", "--out", tmp_path / "job")
    assert passed.exit_code == 0, passed.output
    assert f"note: passing over {step_dir(tmp_path, 2)}: no manifest.json in it" in passed.output


def test_commit_refuses_a_step_folder_that_is_already_there(tmp_path):
    fake_checkpoint(tmp_path / "whole", 1)
    manifest = read_manifest(step_dir(tmp_path / "whole", 1))
    shutil.copytree(step_dir(tmp_path / "whole", 1), partial_dir(tmp_path / "ck", 1))
    step_dir(tmp_path / "ck", 1).mkdir()
    (step_dir(tmp_path / "ck", 1) / "rank0.pt").write_bytes(b"old")  # os.rename failed here: not empty
    with pytest.raises(CheckpointError, match="already there"):
        commit(tmp_path / "ck", manifest)
    assert (step_dir(tmp_path / "ck", 1) / "rank0.pt").read_bytes() == b"old"


# finding 3: --timeout inf


@pytest.mark.parametrize("value, message", [("inf", "finite number"), ("nan", "finite number"),
                                            ("1e9", "less than or equal to 86400")])
@pytest.mark.parametrize("torchrun", [False, True])
def test_a_timeout_that_is_not_finite_or_too_long_is_refused_before_anything_starts(tmp_path, value, message,
                                                                                     torchrun):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rank3.log").write_text("an earlier run's")
    result = cli("demo-tiny", "demo-tiny", "--timeout", value, "--out", tmp_path / "out",
                 *(["--torchrun"] if torchrun else []))
    assert result.exit_code == 2, result.output
    assert error_lines(result) == [ln for ln in result.output.splitlines() if ln.strip()]
    assert error_lines(result)[0].startswith("error: --timeout: ") and message in result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank3.log"]  # nothing written, nothing removed


# finding 4: an output folder used again


def test_an_earlier_runs_files_in_out_are_removed_and_said(tmp_path):
    out = tmp_path / "out"
    (out / "attempt-1").mkdir(parents=True)
    for name in ("rank0.log", "rank1.log", "rank2.log", "rank3.log", "metrics.json", "steps.jsonl", "elastic.jsonl",
                 "attempt-1/rank0.log", "attempt-1/job.json"):
        (out / name).write_text("an earlier run's")
    (out / "notes.txt").write_text("mine")
    result = cli("demo-tiny", two_rank_plan(tmp_path), "--torchrun", "--out", out)
    assert result.exit_code == 0, result.output
    (said,) = [ln for ln in result.output.splitlines() if ln.startswith("note: removed an earlier run's files")]
    assert all(name in said for name in ("rank2.log", "rank3.log", "elastic.jsonl", "attempt-1/job.json"))
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "notes.txt"]
    assert json.loads((out / "job.json").read_text())["plan"]["pipelines"][0]["stages"][0]["devices"] == [0]


def test_a_local_run_over_a_four_rank_runs_folder_keeps_only_its_own_logs(tmp_path, one_torch_thread):
    out = tmp_path / "out"
    out.mkdir()
    for rank in range(4):
        (out / f"rank{rank}.log").write_text("an earlier run's")
    result = cli("demo-tiny", two_rank_plan(tmp_path), "--steps", 1, "--seq-len", 8, "--out", out)
    assert result.exit_code == 0, result.output
    assert "note: removed an earlier run's files from" in result.output
    assert sorted(p.name for p in out.glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert all("an earlier run's" not in p.read_text() for p in out.glob("rank*.log"))


def test_an_elastic_run_writes_only_its_own_events(tmp_path):
    """run_elastic with a stand-in launch (no processes): the first attempt loses rank 1, the
    second finishes; elastic.jsonl then holds that one event, not an earlier run's as well."""
    from runtime.launch.elastic import run_elastic

    problem, plan = load_problem("demo-tiny"), load_plan("demo-tiny")
    job = make_job(problem, plan, "tiny", steps=2, checkpoint_dir=str(tmp_path / "ck"), save_every=1,
                   out_dir=str(tmp_path / "el"))
    (tmp_path / "el").mkdir()
    (tmp_path / "el" / "elastic.jsonl").write_text('{"attempt": 0, "lost": [9]}\n')
    results = iter([(RunResult([0, -9, 0, 0], [""] * 4, 1.0), [1]), (RunResult([0, 0, 0], [""] * 3, 1.0), [])])
    lines = []
    run_elastic(problem, job, lambda p, pl, lost: (p, pl, 1.0, 1.0), log=lines.append,
                launch=lambda j, failure: next(results))
    events = [json.loads(ln) for ln in (tmp_path / "el" / "elastic.jsonl").read_text().splitlines()]
    assert [e["lost"] for e in events] == [[1]]
    assert any("removed" in ln and "elastic.jsonl" in ln for ln in lines)


def test_the_default_torchrun_folder_says_it_replaced_an_earlier_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = cli("demo-tiny", "demo-tiny", "--torchrun")
    assert first.exit_code == 0 and "replaced" not in first.output
    second = cli("demo-tiny", two_rank_plan(tmp_path), "--torchrun")
    assert second.exit_code == 0, second.output
    assert "note: it replaced the job file an earlier --torchrun wrote there" in second.output


# finding 5: --master-addr ""


@pytest.mark.parametrize("args", [["--master-addr", ""], ["--master-addr", " "], ["--ifname", ""]])
def test_an_empty_address_or_interface_is_refused_in_one_line(tmp_path, args):
    result = cli("demo-tiny", "demo-tiny", "--torchrun", "--out", tmp_path, *args)
    assert result.exit_code == 2 and len(error_lines(result)) == 1, result.output
    assert error_lines(result)[0].startswith(f"error: {args[0]}: expected ")
    assert not (tmp_path / "job.json").exists()


@pytest.mark.parametrize("option, value", [("--master-addr", "10.0.0.1"), ("--ifname", "eth0"), ("--seed", str(2**63))])
def test_what_a_local_run_would_ignore_or_cannot_take_is_refused(tmp_path, option, value):
    """QA: --master-addr and --ifname without --torchrun were ignored silently, and a seed past
    2^63 failed inside the rank (torch's seed is a long long)."""
    result = cli("demo-tiny", "demo-tiny", "--out", tmp_path / "out", "--steps", "1", option, value)
    assert result.exit_code == 2 and len(error_lines(result)) == 1, result.output
    assert option in error_lines(result)[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("first, refused", [("box_1", True), ("0", True), ("box-1", False)])
def test_a_first_machine_name_no_host_resolves_needs_a_master_addr(tmp_path, first, refused):
    """The default master address is the first machine's name: "box_1" (no host name) and "0"
    (which is 0.0.0.0) had been printed into every command."""
    machines = [{"name": first, "gpu": "RTX4090", "count": 2, "intra_bw_gbps": 16},
                {"name": "m2", "gpu": "RTX4090", "count": 2, "intra_bw_gbps": 16}]
    (tmp_path / "p.yaml").write_text(json.dumps({"name": "p", "model": "tiny", "training": {"seq_len": 64, "global_batch": 8},
                                                 "cluster": {"inter_bw_gbps": 1.25, "machines": machines}}))
    (tmp_path / "plan.json").write_text(json.dumps({"format": "hexiscale.plan/1", "problem": "p", "pipelines": [
        {"batch": 8, "stages": [{"devices": [0], "layers": 2}, {"devices": [2], "layers": 2}]}]}))
    result = cli(tmp_path / "p.yaml", tmp_path / "plan.json", "--torchrun", "--out", tmp_path / "out")
    if refused:
        assert result.exit_code == 2 and error_lines(result)[0].startswith("error: --master-addr: "), result.output
        assert not (tmp_path / "out" / "job.json").exists()
    else:
        assert result.exit_code == 0 and f"--master-addr={first}" in result.output, result.output


# finding 6: which steps are saved


@pytest.mark.parametrize("every, note", [
    (5, "note: --save-every 5 saves no checkpoint in steps 1–3: the last step (3) is not saved"),
    (2, "note: --save-every 2 saves a checkpoint after step 2 only: the last step (3) is not saved"),
    (3, None), (1, None)])
def test_a_save_schedule_that_leaves_the_last_step_unsaved_is_said(tmp_path, every, note):
    result = cli("demo-tiny", "demo-tiny", "--steps", 3, "--checkpoint-dir", tmp_path / "ck", "--save-every", every,
                 "--torchrun", "--out", tmp_path / "job")
    assert result.exit_code == 0, result.output
    said = [ln for ln in result.output.splitlines() if ln.startswith("note: --save-every")]
    assert said == ([note] if note else [])


# finding 7: an edited manifest


def test_a_manifest_whose_step_is_not_its_folders_is_refused(tmp_path):
    fake_checkpoint(tmp_path, 2)
    edit_manifest(step_dir(tmp_path, 2), lambda m: m.update(step=7))
    with pytest.raises(CheckpointError, match="says step 7, but its folder step-00000002 is step 2"):
        latest_checkpoint(tmp_path)


def test_a_moved_chunk_is_refused_before_any_process_starts(tmp_path):
    fake_checkpoint(tmp_path, 2)

    def move(manifest):  # rank 1's half of the TP-split embedding, 8 rows up: it overlaps rank 0's
        chunks = manifest["tensors"]["param/embed.weight"]["chunks"]
        chunks[1]["offsets"][0] -= 8

    edit_manifest(step_dir(tmp_path, 2), move)
    before = snapshot(tmp_path)
    result = cli("demo-tiny", "demo-tiny", "--steps", 3, "--seq-len", 16, "--resume", tmp_path)
    assert result.exit_code == 2, result.output
    assert "tensor 'param/embed.weight'" in result.output and "overlap" in result.output
    assert "running" not in result.output and snapshot(tmp_path) == before


@pytest.mark.parametrize("second, reason", [
    (((4, 0), (2, 4)), None),  # rows 0-3 and 4-5: the whole tensor
    (((3, 0), (2, 4)), "overlap"), (((5, 0), (1, 4)), "cover 20 of its 24 elements"),
    (((4, 0), (3, 4)), "outside the tensor's shape (6, 4)"), (((4,), (8,)), "does not have the tensor's 2")])
def test_chunks_that_do_not_tile_their_tensor_are_named(second, reason):
    from runtime.checkpoints.manifest import Chunk, TensorEntry

    chunks = (Chunk(file="rank0.pt", key="a", offsets=(0, 0), sizes=(4, 4)),
              Chunk(file="rank1.pt", key="b", offsets=second[0], sizes=second[1]))
    why = tiling_error(TensorEntry(shape=(6, 4), chunks=chunks))
    assert why is None if reason is None else reason in why, why


def test_the_runtimes_own_checkpoints_tile_every_tensor():
    """The pre-start check never refuses what a run writes: layered plans (TP, uneven pipelines,
    ZeRO-1 rectangles, tied embeddings) and a sequence plan's ZeRO-3 blocks."""
    from runtime.layered.checkpoint import saved_tensors
    from runtime.layered.layout import rank_layout
    from runtime.sequence.checkpoint import saved_tensors as sequence_tensors
    from runtime.sequence.layout import seq_rank_layout
    from test_runtime_zero_sp import GPIPE, GQA, MIXED, THREE, TIED

    tables = [saved_tensors(rank_layout(plan), spec, zero) for plan, spec in ((MIXED, GQA), (THREE, GQA),
                                                                               (GPIPE, TIED)) for zero in (0, 1)]
    job = make_job(load_problem("longctx-tiny"), load_plan("longctx-tiny"), "tiny")
    tables.append(sequence_tensors(seq_rank_layout(job.plan, kv_heads=job.config.model.num_kv_heads), job.config.model))
    assert all(tiling_error(entry) is None for table in tables for entry in table.values())


# finding 8: the torch build a gloo job needs


def test_the_torch_build_note_follows_the_backend(tmp_path):
    gloo = cli("demo-tiny", "demo-tiny", "--torchrun", "--out", tmp_path / "g")
    nccl = cli("demo-tiny", "demo-tiny", "--torchrun", "--backend", "nccl", "--out", tmp_path / "n")
    notes = [[ln for ln in r.output.splitlines() if ln.startswith("# machine")] for r in (gloo, nccl)]
    assert len(notes[0]) == len(notes[1]) == 2
    assert all("any torch build (backend gloo" in n and "CUDA" not in n for n in notes[0])
    assert all("a CUDA build of torch (backend nccl" in n for n in notes[1])


# finding 9: Ctrl-C


@pytest.mark.slow
def test_ctrl_c_says_what_stopped_and_where_the_logs_are(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    command = ["run", "demo-tiny", str(two_rank_plan(tmp_path)), "--steps", "1000", "--seq-len", "8"]
    run = terminal_popen([sys.executable, "-c", "from hexiscale.cli import main; main()", *command], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not run.stdout.readline().startswith("step 1/"):
            assert run.poll() is None, run.stderr.read()
        workers = descendants(run.pid)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith("error: interrupted: stopped the run's 2 processes; logs in ")
    logs = Path(line.rsplit("logs in ", 1)[1])
    assert logs.parent == tmp_path and (logs / "rank0.log").is_file()
    deadline = time.monotonic() + 10  # the forkserver sees its launcher gone a moment later
    while any(running(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in workers if running(p)]


# finding 10: a damaged newest checkpoint beside an older one


def test_a_damaged_newest_checkpoint_names_the_older_one(tmp_path):
    fake_checkpoint(tmp_path, 1)
    fake_checkpoint(tmp_path, 2)
    os.remove(step_dir(tmp_path, 2) / "rank2.pt")
    result = cli("demo-tiny", "demo-tiny", "--steps", 3, "--seq-len", 16, "--resume", tmp_path)
    assert result.exit_code == 2 and len(error_lines(result)) == 1, result.output
    older = step_dir(tmp_path, 1)
    assert error_lines(result)[0].endswith(f"rank2.pt: shard file missing; the older checkpoint {older} can be "
                                           f"resumed by naming it (--resume {older})")
    named = cli("demo-tiny", "demo-tiny", "--steps", 3, "--seq-len", 16, "--resume", older, "--torchrun",
                "--out", tmp_path / "job")
    assert named.exit_code == 0 and "resuming at step 1" in named.output, named.output


def test_a_failed_run_s_error_lines_are_printed_as_the_ranks_wrote_them(monkeypatch, tmp_path):
    """`fail` escapes its message for rich; the failure summary was escaped once more before it,
    so a rank's "[device 3]" reached the terminal as "\\[device 3]"."""
    import hexiscale.cli.run as run_mod

    failed = RunResult(returncodes=[1], logs=["error: rank 0: no memory on [device 3]"], wall_s=0.1,
                       out_dir=str(tmp_path))
    monkeypatch.setattr(run_mod, "launch_local", lambda job: failed)
    result = cli("demo-tiny", "demo-tiny", "--steps", 1, "--out", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert "error: rank 0: no memory on [device 3]" in result.output and "\\[" not in result.output, result.output


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["running", "step 1/"])
def test_two_quick_ctrl_cs_to_the_group_are_one_line_and_leave_no_forkserver_folder(tmp_path, moment):
    """A terminal's Ctrl-C reaches the whole process group. Two of them 5 ms apart printed
    multiprocessing's atexit traceback and left its forkserver's /tmp/pymp-* folder; one during
    the forkserver's import of torch (the run's first seconds) printed the forkserver's
    traceback. Either way it is one line and exit 130, and TMPDIR is left empty of pymp-*."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    command = ["run", "demo-tiny", str(two_rank_plan(tmp_path)), "--steps", "1000", "--seq-len", "8"]
    run = terminal_popen([sys.executable, "-c", "from hexiscale.cli import main; main()", *command], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while not run.stdout.readline().startswith(moment):
            assert run.poll() is None, run.stderr.read()
        for _ in range(2):
            os.killpg(run.pid, signal.SIGINT)
            time.sleep(0.005)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, err
    assert "Traceback" not in err and [ln for ln in err.splitlines() if ln.strip()][0].startswith(
        "error: interrupted: stopped the run's 2 processes"), err
    deadline = time.monotonic() + 10  # the forkserver ends a moment after its launcher
    while list(tmp_path.glob("pymp-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(tmp_path.glob("pymp-*"))


def test_a_resumed_run_takes_the_checkpoints_sequence_length_when_none_is_given(tmp_path):
    """A sequence plan's tiny run trains at s = 16, a layered plan's at 32: resuming a sequence
    checkpoint under a layered plan was refused ('trained with seq_len 16, this run has 32')
    though the user had set neither. Without --seq-len the checkpoint's is taken, and said."""
    trained = cli("longctx-tiny", "longctx-tiny", "--steps", 2, "--checkpoint-dir", tmp_path / "ck", "--save-every", 2,
                  "--out", tmp_path / "seq")
    assert trained.exit_code == 0, trained.output
    layered = tmp_path / "layered.json"
    solved = CliRunner().invoke(app, ["solve", "longctx-tiny", "--kind", "layered", "-s", "symmetric", "-o", str(layered)])
    assert solved.exit_code == 0, solved.output
    resumed = cli("longctx-tiny", layered, "--steps", 4, "--resume", tmp_path / "ck", "--torchrun",
                  "--out", tmp_path / "job")
    assert resumed.exit_code == 0 and "note: --seq-len 16, as the checkpoint was trained" in resumed.output, resumed.output
    assert json.loads((tmp_path / "job" / "job.json").read_text())["config"]["seq_len"] == 16
    other = cli("longctx-tiny", layered, "--steps", 4, "--resume", tmp_path / "ck", "--seq-len", 32, "--torchrun",
                "--out", tmp_path / "job2")
    assert other.exit_code == 2 and "trained with seq_len 16, this run has 32" in other.output  # given: kept, refused


def test_show_and_calibrate_of_an_elastic_runs_folder_name_its_attempts(tmp_path):
    """`show el` and `calibrate el` of an --elastic run's --out folder said it was no run folder,
    with no word of the attempt-N folders the runs are in."""
    for n in (0, 1, 10):
        (tmp_path / f"attempt-{n}").mkdir()
    attempts = ", ".join(str(tmp_path / f"attempt-{n}") for n in (0, 1, 10))
    for command in (["show", str(tmp_path)], ["calibrate", str(tmp_path), "-o", str(tmp_path / "c.yaml")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and error_lines(result) == [
            f"error: {tmp_path} is an --elastic run's folder, each of its attempts a run of one plan: give one of "
            f"{attempts} (the last holds the whole run's loss curve, loss.png)"], result.output
