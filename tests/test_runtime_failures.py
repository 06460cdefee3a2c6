"""Failure behaviour: bad configurations and a dead rank end every process with a message,
in bounded time — never a hang. Also the `hexiscale run` command end to end."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.hardware import Cluster, Machine
from planner.layered.plan import Pipeline, Plan, Stage
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec
from runtime.config import Job, RunConfig
from runtime.failure import FailureInjection
from runtime.launch.launcher import RunError, launch_local, make_job

GQA = ModelSpec(name="gqa", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)
# P0 = [TP 2: 3 layers, TP 1: 1 layer], P1 = [TP 1: 4 layers]: ranks 0,1 | 2 | 3
PLAN = Plan(pipelines=[Pipeline(batch=4, stages=[Stage(devices=[0, 1], layers=3), Stage(devices=[2], layers=1)]),
                       Pipeline(batch=2, stages=[Stage(devices=[3], layers=4)])])
ERROR_LINE = re.compile(r"^error: rank (\d+)\b.*", re.MULTILINE)


def job(model: ModelSpec = GQA, **settings) -> Job:
    config = RunConfig(model=model, seq_len=8, micro_batch=2, steps=3, **settings)
    return Job(plan=PLAN, config=config)


def test_a_killed_rank_ends_every_other_rank_with_a_message(tmp_path):
    result = launch_local(job(timeout_s=20, out_dir=str(tmp_path)), echo=False,
                          failure=FailureInjection(rank=2, step=1, mode="kill"))
    assert result.returncodes[2] == -9  # the hook's SIGKILL
    for rank in (0, 1, 3):
        assert result.returncodes[rank] == 1, result.logs[rank]
        assert result.exit_s[rank] - result.exit_s[2] < 60, result.exit_s
        message = ERROR_LINE.search(result.logs[rank])
        assert message and int(message.group(1)) == rank, result.logs[rank]
        assert "stopping after a failure" in message.group(0)
    assert "killed by signal 9" in result.failure_summary()
    print("exit times after launch, s:", result.exit_s)


def test_tp_size_not_dividing_the_heads_stops_every_rank():
    one_kv_head = GQA.model_copy(update={"heads": 2, "kv_heads": 1, "hidden": 16})
    result = launch_local(job(one_kv_head), echo=False)
    assert result.returncodes == [2, 2, 2, 2]
    for rank, log in enumerate(result.logs):
        assert f"error: rank {rank}" in log
        assert "TP size 2 does not divide the model's kv heads (1)" in log


def test_world_size_that_differs_from_the_plan_stops_every_rank():
    result = launch_local(job(), echo=False, world_size=3)
    assert result.returncodes == [2, 2, 2]
    assert all("the plan uses 4 devices (one process each) but the world has 3 processes" in log
               for log in result.logs)


def four_device_problem(model: ModelSpec) -> Problem:
    cluster = Cluster(machines=[Machine(name="m0", gpu="RTX4090", count=4, intra_bw_gbps=16)],
                      inter_bw_gbps=1)
    return Problem(name="four", cluster=cluster, model=model,
                   training=TrainingSpec(seq_len=16, global_batch=6, micro_batch=2))


def test_make_job_refuses_an_invalid_plan_before_starting_processes():
    problem = four_device_problem(GQA)
    with pytest.raises(RunError, match="invalid for this problem"):
        make_job(problem, PLAN.model_copy(update={"pipelines": PLAN.pipelines[:1]}))  # B = 4 ≠ 6
    tiny = make_job(problem, PLAN).config
    assert tiny.model.layers == 4 and tiny.model.heads % 2 == 0 and tiny.seq_len == 16


def test_cli_runs_the_demo_plan_and_prints_a_summary(tmp_path):
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--steps", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "run summary" in result.output and "replicas identical: True" in result.output
    assert (tmp_path / "metrics.json").is_file()


def test_a_temporary_folder_too_long_for_the_processes_socket_is_one_line(tmp_path):
    """multiprocessing's forkserver binds a Unix socket under TMPDIR (107 characters at most):
    a longer TMPDIR was "internal error (OSError: AF_UNIX path too long)". A fresh process,
    so that its forkserver starts under that folder."""
    import os
    import subprocess
    import sys

    deep = tmp_path / ("x" * (100 - len(str(tmp_path))))
    deep.mkdir()
    done = subprocess.run([sys.executable, "-c", "from hexiscale.cli import main; main()", "run", "demo-tiny",
                           "demo-tiny", "--steps", "1", "--out", str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "TMPDIR": str(deep)})
    errors = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stdout + done.stderr
    assert "too long a path for the processes' Unix socket" in errors[0] and "set TMPDIR" in errors[0]
    assert "Traceback" not in done.stderr


def test_cli_torchrun_prints_one_command_per_machine(tmp_path):
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--torchrun", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    commands = [ln for ln in result.output.splitlines() if "torchrun" in ln and "--node-rank" in ln]
    assert len(commands) == 2  # demo-4: devices 0,1 on one machine, 2,3 on the other
    assert "--nproc-per-node=2" in commands[0] and "--machine 1" in commands[1]
    assert (tmp_path / "job.json").is_file()


def test_cli_refuses_an_invalid_plan_with_one_line(tmp_path):
    bad = Plan(pipelines=[Pipeline(batch=8, stages=[Stage(devices=[1, 2], layers=4)])])  # spans machines
    (tmp_path / "bad.json").write_text(bad.to_json())
    result = CliRunner().invoke(app, ["run", "demo-tiny", str(tmp_path / "bad.json")])
    assert result.exit_code == 2
    assert f"{tmp_path / 'bad.json'}: plan is invalid for demo-tiny: [machine]" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_torchrun_workers_find_their_plan_rank_from_machine_and_local_rank(monkeypatch):
    from runtime.layered.worker import plan_rank
    plan = Plan(pipelines=[Pipeline(batch=4, stages=[Stage(devices=[3], layers=4)]),
                           Pipeline(batch=4, stages=[Stage(devices=[0, 1], layers=3), Stage(devices=[2], layers=1)])])
    cluster = Cluster(machines=[Machine(name="a", gpu="RTX4090", count=2, intra_bw_gbps=16),
                                Machine(name="b", gpu="RTX3090", count=2, intra_bw_gbps=16)], inter_bw_gbps=1)
    problem = Problem(cluster=cluster, model=GQA, training=TrainingSpec(seq_len=8, global_batch=8, micro_batch=2))
    the_job = make_job(problem, plan)
    # ranks in plan order: device 3 → 0, 0 → 1, 1 → 2, 2 → 3
    expected = {(0, 0): 1, (0, 1): 2, (1, 0): 3, (1, 1): 0}
    for (machine, local), rank in expected.items():
        monkeypatch.setenv("LOCAL_RANK", str(local))
        assert plan_rank(the_job, machine) == rank


@pytest.mark.slow
def test_a_rank_that_stops_answering_ends_the_run_by_timeouts(tmp_path):
    result = launch_local(job(timeout_s=5, out_dir=str(tmp_path)), echo=False, grace_s=2,
                          failure=FailureInjection(rank=2, step=1, mode="hang"))
    assert result.killed == [2] and result.returncodes[2] == -9
    first_exit = min(result.exit_s[r] for r in (0, 1, 3))
    assert result.exit_s[2] - first_exit < 5 + 2 + 1  # the launcher's bound after the first failure
    for rank in (0, 1, 3):
        assert result.returncodes[rank] == 1
        assert f"error: rank {rank}" in result.logs[rank] and "Timed out" in result.logs[rank]
    assert "killed by the launcher" in result.failure_summary()


def test_cli_schedule_defaults_to_the_problems_and_an_override_gets_a_note(tmp_path):
    priced = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--torchrun", "--out", str(tmp_path)])
    assert priced.exit_code == 0, priced.output
    assert "1f1b" in priced.output and "note: memory was priced" not in priced.output
    other = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--schedule", "gpipe", "--torchrun",
                                     "--out", str(tmp_path)])
    assert other.exit_code == 0, other.output
    assert "note: memory was priced for the problem's schedule 1f1b; running gpipe" in " ".join(other.output.split())
    assert Job.model_validate_json((tmp_path / "job.json").read_text()).config.schedule == "gpipe"


@pytest.mark.parametrize("option, expected", [
    (["--schedule", "foo"], "--schedule: Input should be '1f1b' or 'gpipe' (got 'foo')"),
    (["--timeout", "-1"], "--timeout: Input should be greater than 0"),
    (["--data", "foo"], "--data: 'foo' is neither synthetic nor corpus"),
    (["--lr", "-1"], "--lr: Input should be greater than or equal to 0"),
    (["--backend", "foo"], "--backend: Input should be 'gloo' or 'nccl'"),
    (["--wait", "spin"], "--wait: Input should be 'auto' or 'asleep'"),
])
def test_cli_bad_run_settings_name_the_option_in_one_line(option, expected):
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", *option])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert expected in text and "validation error" not in text and "Traceback" not in text


def test_cli_nccl_without_cuda_says_use_gloo(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--backend", "nccl"])
    assert result.exit_code == 2
    assert "nccl needs CUDA; this machine has none: use --backend gloo" in " ".join(result.output.split())


def test_cli_nccl_with_fewer_gpus_than_processes_says_so_before_starting(monkeypatch):
    """NCCL refuses two ranks on one GPU: a 4-device plan on a 1-GPU machine is one line, no run."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--backend", "nccl"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "running" not in text, text
    assert "the plan runs 4 processes here, one per GPU, and this machine has 1 GPU" in text


def test_cli_unwritable_out_fails_before_training(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--out", str(tmp_path / "a-file" / "run")])
    assert result.exit_code == 2 and "--out" in result.output and "running" not in result.output


def test_cli_a_plan_for_another_problem_needs_force(tmp_path):
    result = CliRunner().invoke(app, ["run", "tiny-4-tiny-mha", "demo-tiny", "--torchrun", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--force" in result.output
    forced = CliRunner().invoke(app, ["run", "tiny-4-tiny-mha", "demo-tiny", "--torchrun", "--force",
                                      "--out", str(tmp_path)])
    assert "--force" not in forced.output


def test_cli_wait_asleep_reaches_the_job_and_runs(tmp_path):
    """--wait asleep is a run setting every rank reads from the job (runtime.communication.communicator.waits_awake)."""
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--wait", "asleep", "--steps", "1",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert Job.model_validate_json((tmp_path / "job.json").read_text()).config.wait == "asleep"
