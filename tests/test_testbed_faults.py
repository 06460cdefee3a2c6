"""Network faults on the emulated cluster (issue 32, docs/testbed.md §4): tiny-2 (two machines of one
device each) as two namespaces; a plan with one stage on each, so every step sends activations and
gradients across the link; each machine runs the command `hexiscale run --torchrun` prints for it.
Elastic runs save a checkpoint every step and re-plan through `solvers.replan`.

1. the link of a machine goes down mid-step: both sides notice within the timeout, the run re-plans
   without that machine and finishes, losses equal to the one-process reference to 1e-5;
2. the link's rate is cut 20× mid-run: same losses, slower, and the link is named against the plan's
   prediction;
3. every process of a machine is SIGKILLed: as 1;
4. the machine holding the rendezvous dies, or never comes up: the other exits within the timeout with
   one line per process, nothing corrupted, no process left;
5. the link goes down for less than the timeout: the run goes on.
After each, the newest complete checkpoint verifies and nothing of the testbed is left."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from planner.io import load_problem
from planner.layered.plan import Pipeline, Plan, Stage
from runtime.checkpoints.manifest import latest_checkpoint, verify
from runtime.launch.elastic import run_elastic
from runtime.launch.launcher import make_job
from runtime.model.reference import train_reference
from runtime.testbed import Testbed
from runtime.testbed.runs import TestbedLaunch
from runtime.testbed.slow_links import slowed_links, problem_on_testbed
from solvers.common import SolverOptions
from solvers.replan import replan
from tests.testbed_helpers import namespace_inodes, needs_testbed, processes_in, state, test_prefix, wait_gone

pytestmark = [needs_testbed, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
TIMEOUT_S = 10.0
NOTICE_SLACK_S = 5.0  # a rank's error line, then its agent's exit
START_S = 30.0  # an agent's start (python, torch) before its rendezvous timeout runs, on loaded cores
STEPS = 6
RTOL = 1e-5
PLAN = Plan(pipelines=[Pipeline(batch=8, stages=[Stage(devices=[0], layers=2), Stage(devices=[1], layers=2)])])


def replanner(problem, plan, lost):
    result = replan(problem, plan, lost, options=SolverOptions(time_limit_s=5))
    return result.problem, result.plan, result.old_s, result.new_s


@pytest.fixture
def problem():
    return load_problem("tiny-2-tiny")  # machines a100-0 (device 0) and r4090-0 (device 1)


@pytest.fixture
def bed_factory():
    """Testbeds made by the test; after it, each must have left nothing (namespaces, hosts and
    temp folders, links, processes in its namespaces)."""
    made = []

    def make(cluster, **options) -> Testbed:
        bed = Testbed(cluster, prefix=test_prefix(), **options)
        made.append((bed, state(bed.layout.prefix)))
        return bed

    yield make
    for bed, before in made:
        assert state(bed.layout.prefix) == before


def fault_job(problem, tmp_path: Path, steps: int = STEPS, seq_len: int = 16):
    return make_job(problem, PLAN, "tiny", steps=steps, seq_len=seq_len, save_every=1, timeout_s=TIMEOUT_S,
                    checkpoint_dir=str(tmp_path / "ckpt"), out_dir=str(tmp_path / "run"))


def after_step(steps_file: Path, step: int, action, delay_s: float = 0.1) -> dict:
    """Run `action` `delay_s` after `steps_file` records `step` (in a thread: the run blocks);
    the returned dict gets the monotonic time it struck."""
    struck: dict = {}

    def watch() -> None:
        while not (steps_file.is_file() and len(steps_file.read_text().splitlines()) >= step):
            time.sleep(0.02)
        time.sleep(delay_s)
        struck["at"] = time.monotonic()
        action()

    threading.Thread(target=watch, daemon=True).start()
    return struck


def assert_losses_match(job, steps: list[dict]) -> None:
    reference, _ = train_reference(job.config, job.plan.global_batch)
    assert [s["step"] for s in steps] == list(range(1, job.config.steps + 1))
    losses = [s["loss"] for s in steps]
    assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(losses, reference)), (losses, reference)


def assert_newest_checkpoint_verifies(job) -> int:
    folder, manifest = latest_checkpoint(job.config.checkpoint_dir)
    verify(folder, manifest)
    return manifest.step


def assert_one_line_per_process(log: str) -> None:
    """Every line of a machine's log is one of ours: no traceback, no C++ log line."""
    assert "Traceback" not in log and "ProcessGroupGloo.cpp" not in log and "frame #" not in log, log
    assert all(line.startswith(("error: ", "machine ", "step ", "saved ", "precision ", "resumed ", "replicas "))
               for line in log.splitlines() if line.strip()), log


def run_with_fault(problem, job, bed: Testbed, fault, step: int = 2):
    """An elastic run on `bed` with `fault(bed)` striking after `step` is recorded; the run, the
    launcher (with its attempts) and when the fault struck."""
    launch = TestbedLaunch(bed)
    struck = after_step(Path(job.config.out_dir) / "attempt-0" / "steps.jsonl", step, lambda: fault(bed))
    events = []
    run = run_elastic(problem, job, replanner, launch=launch, echo=False, log=events.append)
    return run, launch, struck["at"]


def check_replanned_without(run, launch, struck: float, lost: str, survivor: str) -> None:
    first = launch.attempts[0]
    assert first.lost == [lost] and launch.attempts[1].machines == [survivor]
    assert first.exits[survivor] - struck <= TIMEOUT_S + NOTICE_SLACK_S, first.exits  # noticed in time
    (event,) = run.events
    assert event.devices_before == 2 and event.devices_after == 1 and event.lost == [1]


def test_link_down_mid_step_replans_on_the_survivor(problem, bed_factory, tmp_path):
    job = fault_job(problem, tmp_path)
    with bed_factory(problem.cluster) as bed:
        run, launch, struck = run_with_fault(problem, job, bed, lambda b: b.link_down("r4090-0"))
        check_replanned_without(run, launch, struck, "r4090-0", "a100-0")
        first_logs = Path(job.config.out_dir) / "attempt-0"
        for name in ("a100-0", "r4090-0"):
            log = (first_logs / f"{name}.log").read_text()
            assert_one_line_per_process(log)
            assert "Operation timed out" in log or "timed out" in log.lower(), log
    assert_losses_match(job, run.steps)
    assert assert_newest_checkpoint_verifies(job) == STEPS


def test_machine_killed_mid_step_replans_on_the_survivor(problem, bed_factory, tmp_path):
    job = fault_job(problem, tmp_path)
    with bed_factory(problem.cluster) as bed:
        run, launch, struck = run_with_fault(problem, job, bed, lambda b: b.stop_machine("r4090-0"))
        check_replanned_without(run, launch, struck, "r4090-0", "a100-0")
        assert_one_line_per_process((Path(job.config.out_dir) / "attempt-0" / "a100-0.log").read_text())
    assert_losses_match(job, run.steps)
    assert assert_newest_checkpoint_verifies(job) == STEPS


# alone: in the parallel part of one `make test` of four (2026-12-04) r4090-0's rank aborted
# (SIGABRT) during the 2 s flap while another worker loaded both cores; alone it passed every time.
# The cause is not established (docs/testbed.md §6).
@pytest.mark.alone
def test_short_link_flap_is_ridden_out(problem, bed_factory, tmp_path):
    job = fault_job(problem, tmp_path)

    def flap(bed: Testbed) -> None:
        bed.link_down("r4090-0")
        time.sleep(TIMEOUT_S / 5)
        bed.link_up("r4090-0")

    with bed_factory(problem.cluster) as bed:
        run, launch, _ = run_with_fault(problem, job, bed, flap)
    assert len(launch.attempts) == 1 and not run.events and run.result.ok
    assert_losses_match(job, run.steps)
    assert assert_newest_checkpoint_verifies(job) == STEPS


def test_rate_cut_20x_finishes_slower_and_names_the_link(problem, bed_factory, tmp_path):
    job = fault_job(problem, tmp_path, steps=8, seq_len=32)
    with bed_factory(problem.cluster, scale=0.0008) as bed:  # 8 Mbit/s, then 0.4: a step's 32 KiB each way matters
        slow = bed.layout.slot("r4090-0").link_mbit / 20
        run, launch, _ = run_with_fault(problem, job, bed, lambda b: b.set_rate("r4090-0", slow), step=4)
        scale = bed.layout.scale
    assert len(launch.attempts) == 1 and run.result.ok
    assert_losses_match(job, run.steps)
    (line,) = slowed_links(problem_on_testbed(problem, job, scale), PLAN, run.steps)
    assert "link a100-0 → r4090-0" in line and int(line.split("from step ")[1].split(":")[0]) >= 5, line
    before = [s["step_s"] for s in run.steps[2:4]]  # steps 3 and 4: after the warm-up, before the cut
    after = [s["step_s"] for s in run.steps[5:]]
    assert sum(after) / len(after) > 2 * sum(before) / len(before), (before, after)


def test_rendezvous_machine_killed_the_other_exits_in_time(problem, bed_factory, tmp_path):
    job = fault_job(problem, tmp_path)
    with bed_factory(problem.cluster) as bed:
        inodes = namespace_inodes(bed)
        launch = TestbedLaunch(bed)
        attempt_job = job.model_copy(update={"config": job.config.model_copy(
            update={"out_dir": str(tmp_path / "run" / "attempt-0")})})
        struck = after_step(Path(attempt_job.config.out_dir) / "steps.jsonl", 2, lambda: bed.stop_machine("a100-0"))
        result, lost = launch(attempt_job)
        (attempt,) = launch.attempts
        assert attempt.exits["r4090-0"] - struck["at"] <= TIMEOUT_S + NOTICE_SLACK_S and not attempt.killed
        assert lost == [0] and result.returncodes[0] < 0 and result.returncodes[1] == 1  # a100-0 holds rank 0
        log = result.logs[1]
        assert_one_line_per_process(log)
        assert log.count("error: ") == 2  # its rank, then its agent
        assert wait_gone(inodes) == []  # nothing left in any namespace before the testbed goes
    assert assert_newest_checkpoint_verifies(job) >= 2


def test_rendezvous_machine_never_up_the_other_gives_up_in_time(problem, bed_factory, tmp_path):
    job = fault_job(problem, tmp_path)
    with bed_factory(problem.cluster) as bed:
        inodes = namespace_inodes(bed)
        bed.link_down("a100-0")  # the master's machine is unreachable from the start
        launch = TestbedLaunch(bed)
        attempt_job = job.model_copy(update={"config": job.config.model_copy(
            update={"out_dir": str(tmp_path / "run" / "attempt-0")})})
        result, _ = launch(attempt_job)
        (attempt,) = launch.attempts
        assert not result.ok and not attempt.killed
        assert max(result.exit_s) <= TIMEOUT_S + START_S, result.exit_s
        for name, log in zip(attempt.machines, result.logs):
            assert_one_line_per_process(log)
            assert f"error: machine {name}: no rendezvous with the master at a100-0:" in log, log
        assert processes_in(inodes) == []
    assert not list(Path(job.config.checkpoint_dir).glob("step-*"))  # nothing was written
