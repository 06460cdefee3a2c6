"""A --torchrun run's run log: the worker that holds rank 0 writes the runlog.json a local run's
launcher writes (same content), atomically, into its own out folder; `hexiscale calibrate` takes
that folder and, for a torchrun folder without one, names the machine whose folder has it.
(The run itself across two loopback machines: tests/test_runtime_launch.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from hexiscale.cli.calibrate import run_log_path
from planner.problem import Problem
from runtime.config import Job
from runtime.launch.commands import rank0_machine
from runtime.launch.launcher import make_job
from runtime.metrics.runlog import RUNLOG_FILE, log_finished_job, log_run, read_run_log, write_run_log
from tests.test_calibration_cli import invoke, one_error_line
from tests.test_calibration_fit import cluster, plan_of, small_model, small_training

# rank 0 is pipeline 0's first stage, on device 2: machine m1, not the cluster's first machine
PLAN = plan_of((8,), [[((2,), 2), ((0,), 2)]])
STEPS = [{"step": s, "loss": 6.0, "step_s": 0.2 + s / 100, "wall_s": 0.25, "replicas_identical": None,
          "stages": [{"pipeline": 0, "stage": k, "forward_s": 0.05, "backward_s": 0.1, "comm_s": 0.01,
                      "sync_s": 0.0, "tp_s": 0.0} for k in (0, 1)]} for s in (1, 2, 3)]


def torchrun_job(out: Path) -> tuple[Problem, Job]:
    """A job as `hexiscale run --torchrun` writes it into `out` (no rank logs: its machines run it)."""
    problem = Problem(name="calib", cluster=cluster(0.3, 1.5, 0.5), model=small_model(), training=small_training())
    job = make_job(problem, PLAN, "tiny", steps=3, out_dir=str(out))
    out.mkdir(exist_ok=True)
    (out / "job.json").write_text(job.model_dump_json())
    return problem, job


def finish_run(out: Path) -> None:
    """What rank 0 writes once the steps are done."""
    (out / "metrics.json").write_text(json.dumps({"steps": STEPS, "replicas_identical": None}))


def test_rank0_writes_the_run_log_a_local_run_writes(tmp_path):
    problem, job = torchrun_job(tmp_path / "torchrun")
    assert Job.model_validate_json((tmp_path / "torchrun" / "job.json").read_text()).problem == problem
    assert log_finished_job(job) is None  # no finished steps yet (a run that died; another machine)
    finish_run(tmp_path / "torchrun")
    path = log_finished_job(job)
    assert path == tmp_path / "torchrun" / RUNLOG_FILE
    (tmp_path / "local").mkdir()
    local = log_run(problem, job, SimpleNamespace(steps=STEPS, out_dir=str(tmp_path / "local")))
    assert read_run_log(path) == read_run_log(local)
    assert [s.step for s in read_run_log(path).steps] == [1, 2, 3]
    assert sorted(p.name for p in path.parent.iterdir()) == ["job.json", "metrics.json", RUNLOG_FILE]
    assert log_finished_job(job.model_copy(update={"problem": None})) is None  # an older job file


def test_the_run_log_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    _, job = torchrun_job(tmp_path)
    finish_run(tmp_path)
    before = log_finished_job(job).read_text()
    log = read_run_log(tmp_path / RUNLOG_FILE).model_copy(update={"problem": "other"})

    def broken(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_run_log(tmp_path, log)
    assert (tmp_path / RUNLOG_FILE).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json", "metrics.json", RUNLOG_FILE]


def test_calibrate_takes_rank0s_folder_and_names_it_for_the_others(tmp_path):
    _, job = torchrun_job(tmp_path / "m0")
    assert rank0_machine(PLAN, job.cluster) == 1
    out = str(tmp_path / "fitted.yaml")
    one_error_line(invoke("calibrate", str(tmp_path / "m0"), "-o", out), str(tmp_path / "m0"),
                   "--torchrun run's folder without runlog.json", "machine m1, which holds rank 0",
                   "another machine's folder, or the run failed")
    finish_run(tmp_path / "m0")
    log_finished_job(job)
    assert run_log_path(tmp_path / "m0") == tmp_path / "m0" / RUNLOG_FILE
    older = job.model_copy(update={"problem": None})
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "job.json").write_text(older.model_dump_json())
    one_error_line(invoke("calibrate", str(tmp_path / "old"), "-o", out), "names no problem", "write it again")


def test_the_worker_says_where_the_run_log_went_or_why_not(tmp_path, capsys):
    from runtime.launch.worker import EXIT_FAILED, log_torchrun_run

    _, job = torchrun_job(tmp_path)
    finish_run(tmp_path)
    assert log_torchrun_run(job, 1) == 0
    said = capsys.readouterr()
    assert said.out.strip() == f"run log: {(tmp_path / RUNLOG_FILE).resolve()} on machine m1 (for `hexiscale calibrate`)"
    (tmp_path / "metrics.json").write_text('{"steps": [')  # cut short
    assert log_torchrun_run(job, 1) == EXIT_FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: rank 0: {tmp_path / RUNLOG_FILE}: the run log was not written")
