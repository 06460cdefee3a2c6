"""The commands `hexiscale run --torchrun` prints, run unchanged on two emulated machines whose hosts
files map their own names to 127.0.1.1, as Debian and Ubuntu install them (issue 32), over a
200 Mbit/s link: plain torchrun fails there as the issue found ("Connection refused,
remote=[127.0.1.1]"); the printed commands bind the interface that routes to the master and train
like the one-process reference; a master name that resolves to loopback is refused in one line
(the other machine's bounded wait for a master that never comes up: test_testbed_faults.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import load_problem
from runtime.config import Job
from runtime.metrics.runlog import RUNLOG_FILE, read_run_log
from runtime.model.reference import train_reference
from runtime.testbed import Testbed
from tests.testbed_helpers import ROOT, namespace_inodes, needs_testbed, processes_in, state, test_prefix

pytestmark = [needs_testbed]
DEBIAN_200_MBIT = {"scale": 0.02, "loopback_own_name": True}  # tiny-2's 1.25 GB/s → 200 Mbit/s
BINDING = """
import sys
from runtime.launch.netif import InterfaceError, choose_binding
for master in sys.argv[1:]:
    try:
        b = choose_binding(master, 2, env={})
        print(master, b.interface, b.address)
    except InterfaceError as exc:
        print(master, "refused:", exc)
"""


def printed_commands(out, plan, *options: str) -> list[str]:
    result = CliRunner().invoke(app, ["run", "tiny-2-tiny", str(plan), "--steps", "3", "--timeout", "15",
                                      "--seq-len", "16", "--torchrun", "--out", str(out), *options])
    assert result.exit_code == 0, result.output
    return [ln for ln in result.output.splitlines() if ln.startswith("python -m runtime.launch.torchrun ")]


@pytest.fixture
def plan_file(tmp_path):
    """tiny-2-tiny's two machines as two pipeline stages: every step crosses the link."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"format": "hexiscale.plan/1", "problem": "tiny-2-tiny", "pipelines": [
        {"batch": 8, "stages": [{"devices": [0], "layers": 2}, {"devices": [1], "layers": 2}]}]}))
    return path


def run_everywhere(bed: Testbed, commands: list[str], tmp: Path, plain_torchrun: bool = False) -> list[tuple[int, str]]:
    """Each machine's line inside its namespace (the python of this venv), `tmp` its temporary
    folder; plain_torchrun: the same arguments given to torchrun itself, as a user without the
    wrapper would (stopped once the first machine has failed: plain torchrun's other agent went on
    for minutes in issue 32)."""
    tmp.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp))
    procs, outputs = [], []
    for machine, line in enumerate(commands):
        argv = [sys.executable, *shlex.split(line)[1:]]
        if plain_torchrun:
            argv[1:3] = ["-m", "torch.distributed.run"]
        # a file, not a pipe read after the wait: a machine whose output filled a pipe nobody read
        # would block, and the other with it (the suite once saw this test wait out its 180 s)
        outputs.append(tempfile.TemporaryFile("w+"))
        procs.append(bed.start(machine, argv, cwd=ROOT, env=env, stdout=outputs[-1], stderr=subprocess.STDOUT,
                               text=True))
    if plain_torchrun:
        while all(p.poll() is None for p in procs):
            time.sleep(0.1)
        for machine in range(len(procs)):
            bed.stop_machine(machine)
    return [(_wait_or_kill(bed, machine, p), _read(out)) for machine, (p, out) in enumerate(zip(procs, outputs))]


def _wait_or_kill(bed: Testbed, machine: int, proc: subprocess.Popen) -> int | None:
    """The exit code, or None after 180 s (the machine's processes then killed: the output says why)."""
    try:
        return proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        bed.stop_machine(machine)
        proc.wait(timeout=30)
        return None


def _read(output) -> str:
    with output:
        output.seek(0)
        return output.read()


def test_the_interface_toward_the_master_on_debian_hosts():
    prefix = test_prefix()
    before = state(prefix)
    with Testbed(load_problem("tiny-2-tiny").cluster, prefix=prefix, **DEBIAN_200_MBIT) as bed:
        own = bed.run("a100-0", [sys.executable, "-c", BINDING, "a100-0", "10.77.0.1", "127.0.0.1"], cwd=ROOT)
        other = bed.run("r4090-0", [sys.executable, "-c", BINDING, "a100-0"], cwd=ROOT)
    lines = own.stdout.splitlines()
    assert lines[0].startswith("a100-0 refused: the master address a100-0 resolves to 127.0.1.1 here"), own
    assert lines[1:] == ["10.77.0.1 eth0 10.77.0.1", "127.0.0.1 lo 127.0.0.1"], own
    assert other.stdout.splitlines() == ["a100-0 eth0 10.77.0.2"], other
    assert state(prefix) == before


@pytest.mark.slow
def test_printed_commands_train_where_plain_torchrun_fails(tmp_path, plan_file):
    commands = printed_commands(tmp_path / "run", plan_file, "--master-addr", "10.77.0.1")
    prefix = test_prefix()
    before = state(prefix)
    with Testbed(load_problem("tiny-2-tiny").cluster, prefix=prefix, **DEBIAN_200_MBIT) as bed:
        inodes = namespace_inodes(bed)
        plain = run_everywhere(bed, commands, tmp_path / "tmp-plain", plain_torchrun=True)
        assert any(code not in (None, 0) for code, _ in plain)
        assert any("Connection refused, remote=[127.0.1.1]" in out for _, out in plain), plain  # issue 32's failure
        fixed = run_everywhere(bed, commands, tmp_path / "tmp-fixed")
        assert processes_in(inodes) == []  # every agent and rank gone before the testbed is
    assert state(prefix) == before
    assert [code for code, _ in fixed] == [0, 0], fixed
    assert not list((tmp_path / "tmp-fixed").glob("torchelastic_*"))  # plain torchrun leaves one per machine
    assert "machine a100-0: ranks bind eth0 (10.77.0.1)" in fixed[0][1]
    assert "machine r4090-0: ranks bind eth0 (10.77.0.2)" in fixed[1][1]
    job = Job.model_validate_json((tmp_path / "run" / "job.json").read_text())
    steps = json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"]
    reference, _ = train_reference(job.config, job.plan.global_batch)
    assert [s["loss"] for s in steps] == pytest.approx(reference, rel=1e-5)
    log = read_run_log(tmp_path / "run" / RUNLOG_FILE)  # the first machine's, which holds rank 0
    assert [s.step_s for s in log.steps] == [s["step_s"] for s in steps] and "run log: " in fixed[0][1]
