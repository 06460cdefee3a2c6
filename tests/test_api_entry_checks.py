"""The Python API (`import hexiscale as hx`) from a QA pass: a problem or plan changed with pydantic's
`model_copy(update=...)` is checked again at every entry point (one InputError naming the field);
run_plan trains 'tiny' or 'problem' only and starts at most 8 processes per core; replan names
what was lost, as ids; SolverOptions' time limit is finite and at most a week; calibrate
refuses a log whose steps are all warm-up; and the package's own example runs as written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import hexiscale as hx
import planner
import runtime.host
from hexiscale.cli import app
from runtime.launch import launcher
from runtime.launch.launcher import RunError, make_job
from solvers.common import MAX_TIME_LIMIT_S
from solvers.replan import ReplanError, lost_devices
from tests.test_calibration_cli import PLANS, plan_of, synthetic_log

QUICK = hx.SolverOptions(time_limit_s=1)


@pytest.fixture
def no_processes(monkeypatch):
    """run_plan must refuse before any process starts: starting one fails the test."""
    def spawn(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(launcher, "_spawn", spawn)


def with_training(problem: hx.Problem, **update) -> hx.Problem:
    return problem.model_copy(update={"training": problem.training.model_copy(update=update)})


# (the change, the field the message must name): each once a crash or a wrong answer deep inside
CHANGED = [
    (dict(seq_len=0), "training.seq_len"),  # solve had said optimal, T = 0.00016 s
    (dict(param_state_bytes=0), "training.param_state_bytes"),  # ZeroDivisionError in solve
    (dict(zero_stage=5), "training.zero_stage"),  # accepted
    (dict(micro_batch=0), "training.micro_batch"),  # ZeroDivisionError
    (dict(global_batch=0), "training.global_batch"),  # a reshape ValueError
    (dict(global_batch="16"), "training.global_batch"),  # "batches sum to 16, the global batch is 16"
    (dict(reserved_gib=math.inf), "training.reserved_gib"),  # a NaN error
]


@pytest.mark.parametrize("update,field", CHANGED)
def test_a_problem_changed_by_model_copy_is_checked_at_every_entry_point(update, field, no_processes):
    problem, plan = hx.load_problem("demo-tiny"), hx.load_plan("demo-tiny")
    bad = with_training(problem, **update)
    calls = [lambda: hx.validate(bad, plan), lambda: hx.evaluate(bad, plan), lambda: hx.solve(bad, options=QUICK),
             lambda: hx.replan(bad, plan, [3], options=QUICK), lambda: hx.run_plan(bad, plan, steps=1, echo=False)]
    for call in calls:
        with pytest.raises(hx.InputError) as caught:
            call()
        assert str(caught.value).startswith(f"problem: {field}: ") and "\n" not in str(caught.value)


def test_an_emptied_cluster_or_plan_is_named_not_an_index_error():
    problem, plan = hx.load_problem("demo-asym"), hx.load_plan("demo-tiny")
    no_machines = problem.model_copy(update={"cluster": problem.cluster.model_copy(update={"machines": ()})})
    with pytest.raises(hx.InputError, match=r"^problem: cluster\.machines: "):
        hx.validate(no_machines, plan)
    with pytest.raises(hx.InputError, match=r"^problem: cluster\.machines: "):
        hx.solve(no_machines, options=QUICK)
    with pytest.raises(hx.InputError, match=r"^plan: pipelines: "):
        hx.evaluate(problem, plan.model_copy(update={"pipelines": ()}))


def test_an_unchanged_problem_is_priced_as_before_and_names_may_be_long_or_bundled():
    """The check changes nothing valid: the same T as the planner's own evaluate; a derived
    name past a file's 200 characters (a replanned problem's) is kept; a bundled name or a path
    stands for the problem or plan; anything else is a TypeError naming the argument."""
    problem, plan = hx.load_problem("demo-tiny"), hx.load_plan("demo-tiny")
    assert hx.evaluate(problem, plan).iteration_s == planner.evaluate(problem, plan).iteration_s
    long_named = problem.model_copy(update={"name": "x" * 300})
    assert hx.validate(long_named, plan) == []
    assert hx.evaluate("demo-tiny", "demo-tiny").iteration_s == planner.evaluate(problem, plan).iteration_s
    by_name = hx.solve("demo-tiny", options=QUICK)
    assert by_name.objective_s == hx.solve(problem, options=QUICK).objective_s
    with pytest.raises(TypeError, match="^problem: expected a hexiscale.Problem"):
        hx.solve(3)
    with pytest.raises(TypeError, match="not a plan"):
        hx.replan(problem, None, [3])


@pytest.fixture(scope="module")
def llama_7b() -> tuple[hx.Problem, hx.Plan]:
    problem = hx.load_problem("tiny-4-llama2-7b")
    return problem, hx.solve(problem, options=QUICK).plan


@pytest.mark.parametrize("model", ["tyni", "Tiny", None, ""])
def test_run_plan_trains_the_tiny_or_the_problem_s_model_only(model, llama_7b, no_processes):
    """Any other name had trained the problem's full model (7B on CPU processes), in both kinds."""
    for problem, plan in (llama_7b, (hx.load_problem("longctx-tiny"), hx.load_plan("longctx-tiny"))):
        with pytest.raises(RunError, match=f"^model: expected 'tiny' .* or 'problem' .*, got {model!r}$"):
            make_job(problem, plan, model, steps=1)
    with pytest.raises(RunError, match="^model: "):
        hx.run_plan(hx.load_problem("demo-tiny"), hx.load_plan("demo-tiny"), model=model, steps=1, echo=False)


def test_both_model_names_still_pick_their_model(llama_7b):
    problem, plan = llama_7b
    assert make_job(problem, plan, "problem", steps=1).config.model == problem.model
    assert make_job(problem, plan, "tiny", steps=1).config.model.hidden < problem.model.hidden


def test_a_local_run_past_8_processes_per_core_is_refused_before_any_starts(monkeypatch, tmp_path, no_processes):
    """The CLI refused it; run_plan started every process (24 on 2 cores). On a host of one core
    allowed 1 rank each, demo-tiny's 4 ranks are too many: nothing starts and no out folder is made."""
    monkeypatch.setattr(runtime.host, "usable_cores", lambda: 1)
    monkeypatch.setattr(runtime.host, "MAX_RANKS_PER_CORE", 1)
    out = tmp_path / "run"
    with pytest.raises(RunError, match=r"^the plan uses 4 devices, one process each: 4 processes on 1 core: "
                                       r"at most 1 per core .*--torchrun"):
        hx.run_plan("demo-tiny", "demo-tiny", steps=1, echo=False, out_dir=str(out))
    assert not out.exists()
    job = make_job(hx.load_problem("demo-tiny"), hx.load_plan("demo-tiny"), steps=1, backend="nccl")
    with pytest.raises(AssertionError, match="a process was started"):  # NCCL: one per GPU, checked apart
        launcher.launch_local(job, echo=False)


@pytest.mark.parametrize("lost,reason", [
    ("13", "^lost: expected a list of device ids"),  # had lost devices 1 and 3
    (3, "^lost: expected a list of device ids"),
    ([True], r"^lost: device ids are ints, got True \(bool\)"),  # had lost device 1
    ([3.0], r"^lost: device ids are ints, got 3.0 \(float\)"),  # had lost device 3
    ([], "^name what was lost"),  # had re-planned as 'demo-asym-without-'
    ([3, 2, 3], "^lost: device 3 is named twice$"),  # had re-planned as if only 2 and 3 were named
    (np.array([1, 1]), "^lost: device 1 is named twice$"),
])
def test_replan_takes_a_list_of_int_device_ids_and_at_least_one(lost, reason):
    problem, plan = hx.load_problem("demo-asym"), hx.load_plan("demo-tiny")
    with pytest.raises(ReplanError, match=reason):
        hx.replan(problem, plan, lost, options=QUICK)


def test_nothing_lost_by_default_is_refused_and_numpy_ids_and_machines_are_kept():
    problem = hx.load_problem("demo-asym")
    with pytest.raises(ReplanError, match="^name what was lost"):
        hx.replan(problem, hx.load_plan("demo-tiny"), options=QUICK)
    with pytest.raises(ReplanError, match="^lost_machines: expected a list"):
        lost_devices(problem, machines="r3090-0")
    assert lost_devices(problem, np.array([3, 2])) == {2, 3} == lost_devices(problem, machines=["r3090-0", 1])
    with pytest.raises(ReplanError, match=r"^lost_machines: machine 'r4090-0' is named twice \(as 'r4090-0' and 1\)$"):
        hx.replan(problem, hx.load_plan("demo-tiny"), lost_machines=["r4090-0", 1], options=QUICK)


@pytest.mark.parametrize("limit", [math.inf, math.nan, 1e30, MAX_TIME_LIMIT_S * 1.001, 0])
def test_solver_options_refuse_a_time_limit_the_cli_refuses(limit):
    with pytest.raises(ValidationError, match="time_limit_s"):
        hx.SolverOptions(time_limit_s=limit)


def test_solver_options_take_a_week_and_are_checked_again_when_copied():
    assert hx.SolverOptions(time_limit_s=MAX_TIME_LIMIT_S).time_limit_s == 7 * 24 * 3600
    copied = QUICK.model_copy(update={"time_limit_s": math.inf})
    with pytest.raises(hx.InputError, match="^options: time_limit_s: "):
        hx.solve("demo-tiny", options=copied)


def test_calibrate_refuses_a_log_of_warm_up_steps_alone(tmp_path):
    """`run --steps 2` then calibrate (2 warm-up steps by default) had fitted the warm-up steps
    silently, --keep-undetermined or not."""
    log = synthetic_log(tmp_path, "runA", plan_of(*PLANS[2]))
    data = json.loads(log.read_text())
    data["steps"] = data["steps"][:2]
    log.write_text(json.dumps(data))
    out = tmp_path / "cal.yaml"
    done = CliRunner().invoke(app, ["calibrate", str(log), "-o", str(out), "--keep-undetermined"])
    lines = [ln for ln in done.output.splitlines() if ln.strip()]
    assert done.exit_code == 2 and len(lines) == 1 and not out.exists(), done.output
    line = " ".join(done.output.split())
    assert line.startswith(f"error: {log}: every step of this run is warm-up (2 steps, --warmup 2)")
    assert "more --steps (at least 3)" in line and "a smaller --warmup" in line
    fitted = CliRunner().invoke(app, ["calibrate", str(log), "-o", str(out), "--keep-undetermined", "--warmup", "1"])
    assert fitted.exit_code == 0 and out.exists(), fitted.output


def test_the_package_example_runs_as_written_from_any_folder(tmp_path):
    """help(hexiscale)'s example, run as a script in an empty folder: its bundled problem is
    found and its run starts within 8 processes per core (it had loaded a repo-relative path and
    run a 24-device plan)."""
    example = textwrap.dedent(hx.__doc__.split("\n\n")[1])
    assert "hx.run_plan(" in example and "hx.replan(" in example
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
