"""Launching: the torchrun commands `hexiscale run --torchrun` prints work as printed, a
killed launcher takes its workers with it, and `run_plan` works from an unguarded script."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import load_cluster, load_plan, load_problem
from runtime.launch.launcher import launch_local, make_job
from runtime.metrics.runlog import log_run, read_run_log

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN_WAIT_S = 120


def printed_torchrun_commands(out: Path) -> tuple[str, list[str]]:
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--model", "tiny", "--steps", "2",
                                      "--torchrun", "--master-addr", "127.0.0.1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result.output, [ln for ln in result.output.splitlines() if ln.startswith("python -m runtime.launch.torchrun ")]


def test_torchrun_prints_the_job_file_and_one_command_per_machine(tmp_path):
    output, commands = printed_torchrun_commands(tmp_path)
    assert str(tmp_path / "job.json") in output and (tmp_path / "job.json").is_file()
    assert "running" not in output  # nothing runs here
    assert len(commands) == 2  # demo-4: two machines
    assert all("HEXISCALE_PORT" not in c for c in commands)
    assert all("--master-addr=127.0.0.1" in c and "--rdzv-conf=timeout=60" in c for c in commands)
    assert "127.0.0.1 is a loopback address: these commands work only with every machine on this one host" in output
    said = " ".join(output.split())
    assert "machine r4090-0 holds rank 0: the steps and, once the run has done them, the run log runlog.json" in said
    refused = CliRunner().invoke(app, ["calibrate", str(tmp_path), "-o", str(tmp_path / "fitted.yaml")])
    assert refused.exit_code == 2 and "machine r4090-0, which holds rank 0, writes it" in " ".join(refused.output.split())


@pytest.mark.slow
def test_the_printed_torchrun_commands_train_like_the_local_launcher(tmp_path):
    _, commands = printed_torchrun_commands(tmp_path / "torchrun")
    (tmp_path / "tmp").mkdir()  # the agents' temporary folder: torchrun left a torchelastic_* there per run
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path / "tmp"))
    procs = [subprocess.Popen([sys.executable, *shlex.split(c)[1:]],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in commands]
    try:
        outputs = [p.communicate(timeout=TORCHRUN_WAIT_S)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert not list((tmp_path / "tmp").glob("torchelastic_*"))
    torchrun_steps = json.loads((tmp_path / "torchrun" / "metrics.json").read_text())["steps"]

    job = make_job(load_problem("demo-tiny"), load_plan("demo-tiny"), "tiny", steps=2,
                   out_dir=str(tmp_path / "local"))
    local = launch_local(job, echo=False)
    assert local.ok, local.failure_summary()
    assert len(torchrun_steps) == len(local.steps) == 2
    for ours, theirs in zip(torchrun_steps, local.steps):
        assert abs(ours["loss"] - theirs["loss"]) <= 1e-6, (torchrun_steps, local.steps)
    check_torchrun_run_log(tmp_path, outputs, torchrun_steps, log_run(load_problem("demo-tiny"), job, local))


def check_torchrun_run_log(tmp_path: Path, outputs: list[str], steps: list[dict], local_log: Path) -> None:
    """Rank 0's machine (the first, r4090-0) wrote the run log a local run writes, said so last,
    and `hexiscale calibrate` reads it beside the local run's as one problem on one cluster and
    fits both. Whether the fit can determine a figure is the data's verdict, not the log's: two
    runs of one plan give every stage one point, and this passed only while each rank's first
    step carried a second of imports (torch._dynamo, now in the local launcher's forkserver)."""
    path = tmp_path / "torchrun" / "runlog.json"
    assert outputs[0].strip().splitlines()[-1] == f"run log: {path.resolve()} on machine r4090-0 (for `hexiscale calibrate`)"
    assert "run log:" not in outputs[1]
    log, local = read_run_log(path), read_run_log(local_log)
    assert [(s.step, s.step_s, s.wall_s) for s in log.steps] == [(s["step"], s["step_s"], s["wall_s"]) for s in steps]
    assert log.model_dump(exclude={"steps"}) == local.model_dump(exclude={"steps"})
    fitted = tmp_path / "fitted.yaml"
    result = CliRunner().invoke(app, ["calibrate", str(tmp_path / "torchrun"), str(tmp_path / "local"), "-o",
                                      str(fitted), "--warmup", "0", "--keep-undetermined"])
    sources = f"{tmp_path / 'torchrun' / 'runlog.json'}, {tmp_path / 'local' / 'runlog.json'}: "
    said = " ".join(result.output.split())
    if result.exit_code == 0:
        assert load_cluster(fitted).catalog  # a cluster the planner reads
    else:  # both read and fitted together; refused only for what the points cannot tell apart
        assert result.exit_code == 2 and sources in said, said
        assert "no figure can be determined from these runs" in said, said


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc: no psutil)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


LONG_RUN = """
from planner.io import load_plan, load_problem
from runtime.launch.launcher import launch_local, make_job
job = make_job(load_problem("demo-tiny"), load_plan("demo-tiny"), "tiny", steps=100000, out_dir={out!r})
launch_local(job)
"""


@pytest.mark.slow
def test_workers_die_with_a_launcher_killed_by_sigkill(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", LONG_RUN.format(out=str(tmp_path))], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not launcher.stdout.readline().startswith("step 1/"):  # the first step is done
            assert launcher.poll() is None and time.monotonic() < deadline, "the run did not start"
        workers = descendants(launcher.pid)
        assert len(workers) >= 4  # the four ranks (and the forkserver)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 10
        while any(running(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in workers if running(p)], "workers outlived their launcher"
    finally:
        launcher.kill()
        for pid in descendants(launcher.pid) | locals().get("workers", set()):
            if running(pid):
                os.kill(pid, signal.SIGKILL)


UNGUARDED_SCRIPT = """
import hexiscale as hx
from planner.io import load_plan, load_problem

result = hx.run_plan(load_problem("demo-tiny"), load_plan("demo-tiny"), steps=1, echo=False)
print("steps", len(result.steps))
"""


@pytest.mark.slow
def test_run_plan_works_from_a_script_without_a_main_guard(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(UNGUARDED_SCRIPT))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("steps 1") == 1  # the script ran once, not again in the workers


LAUNCHER_PROBE = '''
import atexit, sys
atexit.register(lambda: print("torch in the launcher:", "torch" in sys.modules))
from hexiscale.__main__ import main
sys.argv = ["hexiscale", "run", "demo-tiny", "demo-tiny", "--steps", "1", "--out", sys.argv[1]]
main()
'''


@pytest.mark.slow
def test_the_launcher_never_imports_torch_and_the_ranks_find_dynamo_imported(tmp_path):
    """`hexiscale run`'s own process imports no torch (pickling the ranks' target had imported
    it, two seconds before the forkserver did), and the forkserver has imported torch._dynamo,
    which torch imports on each rank's first optimizer (a second of a core per rank)."""
    from runtime.launch.launcher import FORKSERVER_PRELOAD

    assert "torch._dynamo" in FORKSERVER_PRELOAD
    done = subprocess.run([sys.executable, "-c", LAUNCHER_PROBE, str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "torch in the launcher: False"
