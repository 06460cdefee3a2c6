"""Elastic runs (docs/checkpoints.md §10): a rank killed in step 4 of 8 (checkpoints every 2 steps)
ends the attempt; the launcher re-plans on the survivors (solvers.replan), restarts from the
step-2 checkpoint under the new plan, on fewer devices, and finishes: the 8 steps' losses
equal the uninterrupted one-process reference to 1e-5."""

from __future__ import annotations

import pytest

from planner.io import load_plan, load_problem
from runtime.launch.elastic import run_elastic
from runtime.failure import FailureInjection
from runtime.launch.launcher import make_job
from runtime.model.reference import train_reference
from solvers.common import SolverOptions
from solvers.replan import replan

RTOL = 1e-5
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def replanner(problem, plan, lost):
    result = replan(problem, plan, lost, options=SolverOptions(time_limit_s=5))
    return result.problem, result.plan, result.old_s, result.new_s


def test_killed_rank_replans_resumes_and_matches_the_reference(tmp_path):
    problem, plan = load_problem("demo-tiny"), load_plan("demo-tiny")  # 4 ranks: TP 2 + 1 | 1
    job = make_job(problem, plan, "tiny", steps=8, seq_len=16, save_every=2, timeout_s=30,
                   checkpoint_dir=str(tmp_path / "ckpt"), out_dir=str(tmp_path / "run"))
    lines = []
    run = run_elastic(problem, job, replanner, echo=False, log=lines.append,
                      failure=FailureInjection(rank=3, step=3))  # dies in step 4 (1-based)
    (event,) = run.events
    assert event.lost == [3] and event.resumed_step == 2 and event.devices_after < 4
    assert "re-planned 4 → " in lines[0] and " T " in lines[0] and event.new_s > 0 and event.old_s > 0
    assert [s["step"] for s in run.steps] == list(range(1, 9))
    ref_losses, _ = train_reference(job.config, 8)
    losses = [s["loss"] for s in run.steps]
    assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    assert len(run.plan.devices) == event.devices_after and max(run.plan.devices) < 3


def test_cli_elastic_run_logs_the_event_and_finishes_on_fewer_devices(tmp_path, monkeypatch):
    """`hexiscale run --elastic`: the same loop behind the CLI, with solvers.replan as the
    re-planner (the failure is injected by wrapping the loop: injection is not a CLI option)."""
    import functools

    from typer.testing import CliRunner

    import hexiscale.cli.run as cli_run
    from hexiscale.cli import app

    monkeypatch.setattr(cli_run, "run_elastic", functools.partial(run_elastic, failure=FailureInjection(rank=2, step=1)))
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--steps", "3", "--seq-len", "8",
                                      "--elastic", "--checkpoint-dir", str(tmp_path / "ck"), "--save-every", "1",
                                      "--timeout", "30", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "elastic: lost device 2; re-planned 4 → " in result.output and "resuming at step 1" in result.output
    assert "over 3 steps" in result.output
    assert (tmp_path / "out" / "elastic.jsonl").is_file()
