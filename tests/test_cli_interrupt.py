"""Ctrl-C while the `hexiscale` command is still importing (torch, ortools, typer, the planner:
about a second) is one line and exit 130, as a Ctrl-C during the work is; it printed the
traceback of the import it cut, with the shell's 130 only by Python's own death by SIGINT.

The signal is made to land inside the import, whatever the machine's load: a `sitecustomize`
on PYTHONPATH (test-only; nothing in the product) holds one named module's import, says so in a
marker file, and sleeps there until the SIGINT the test sends once it sees the marker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from terminal import terminal_popen

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("typer", "numpy", "solvers")  # imported with the command's modules, not with its entry point

SLOW_IMPORT = '''
import os, sys, time

class HoldOneImport:
    """Holds the import of $SLOW_IMPORT (sleeping, until a signal) once the marker is written."""
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["SLOW_IMPORT"]:
            sys.meta_path.remove(self)
            open(os.environ["SLOW_IMPORT_MARKER"], "w").close()
            time.sleep(120)
        return None

sys.meta_path.insert(0, HoldOneImport())
'''


def console_script() -> str:
    """What pip's `hexiscale` script runs, from pyproject's entry point (an installed script
    may predate a change of it)."""
    text = (ROOT / "pyproject.toml").read_text()
    module, function = re.search(r'^hexiscale = "([\w.]+):(\w+)"', text, re.MULTILINE).groups()
    return f"import sys; from {module} import {function}; sys.exit({function}())"


def interrupted_in_import(tmp_path: Path, module: str, command: list[str]) -> subprocess.CompletedProcess:
    """Run `command` with `module`'s import held, send SIGINT once it is held there."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_IMPORT)
    marker = tmp_path / "held"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), SLOW_IMPORT=module,
               SLOW_IMPORT_MARKER=str(marker))
    proc = terminal_popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a loaded machine starts Python slowly: no tight timing here
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"{module} was never imported"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.mark.parametrize("module", HEAVY)
@pytest.mark.parametrize("args", [["--help"], ["validate", "instances/problems/demo-tiny.yaml"]],
                         ids=["help", "validate"])
def test_ctrl_c_during_the_commands_imports_is_one_line_and_exit_130(tmp_path, module, args):
    done = interrupted_in_import(tmp_path, module, [sys.executable, "-c", console_script(), *args])
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, done.stderr, done.stdout) == (130, "error: interrupted\n", "")


def test_python_dash_m_hexiscale_is_the_command_and_handles_ctrl_c_alike(tmp_path):
    done = interrupted_in_import(tmp_path, "planner", [sys.executable, "-m", "hexiscale", "--help"])
    assert (done.returncode, done.stderr) == (130, "error: interrupted\n")
    shown = subprocess.run([sys.executable, "-m", "hexiscale", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0 and "replan" in shown.stdout


def test_the_entry_point_imports_nothing_heavy():
    """The window a Ctrl-C could still cut into a traceback is Python's own start-up and the
    entry module's import: that import loads none of the command's libraries."""
    entry = console_script().split("from ")[1].split(" import")[0]
    probe = f"import sys, {entry}; print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_ctrl_c_during_the_work_is_the_same_one_line(tmp_path):
    """A Ctrl-C while `frontier` solves its budget levels (its first progress line on stderr
    shows the work has started): typer's own handling ended it with 130 and printed nothing."""
    command = [sys.executable, "-c", console_script(), "frontier", "instances/problems/offers-llama2-13b.yaml",
               "-t", "120", "-o", str(tmp_path / "frontier")]
    proc = terminal_popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # "…: level 1 of 10 …": the work has started
        assert "level" in first, first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.splitlines()[-1:] == ["error: interrupted"], (first, err)
    assert "Traceback" not in err and not (tmp_path / "frontier").exists()


AFTER_A_SOLVE = '''
import sys, time
sys.path.insert(0, {root!r})
from ortools.sat.python import cp_model
from solvers.cp_sat import cp_solver
model = cp_model.CpModel()
x = model.new_int_var(0, 10, "x")
model.maximize(x)
cp_solver(time_limit_s=5, threads=1).solve(model)
try:
    print("solved", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
'''


def test_after_a_cp_sat_solve_ctrl_c_is_still_pythons():
    """CP-SAT's own SIGINT handler left SIGINT at the OS default after a solve: a later Ctrl-C
    killed the process (frontier, after its exact levels) with nothing printed."""
    proc = terminal_popen([sys.executable, "-c", AFTER_A_SOLVE.format(root=str(ROOT))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "solved\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (0, "KeyboardInterrupt\n"), (proc.returncode, err)


def test_ctrl_c_during_a_cp_sat_solve_is_one_line():
    """`solve -s cpsat`: a Ctrl-C during the solve aborted the process (std::bad_function_call,
    SIGABRT). Its first log line on stderr shows the solve has started."""
    command = [sys.executable, "-c", console_script(), "solve", "small-16-llama2-13b", "-s", "cpsat", "-t", "60"]
    proc = terminal_popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        assert first, "cpsat logged no progress line"
        time.sleep(1.0)  # into the solve itself
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.splitlines()[-1:] == ["error: interrupted"], (first, proc.returncode, err[-500:])


def test_ctrl_c_during_a_profile_leaves_no_temporary_folder(tmp_path):
    """The profile's temporary folder (rank logs, its spec) was left behind by a Ctrl-C."""
    command = [sys.executable, "-c", console_script(), "profile", "-o", str(tmp_path / "c.yaml"), "--processes", "2"]
    proc = terminal_popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path)))
    try:
        first = proc.stdout.readline()  # "profiling 2 cpu processes …": the folder is made next
        assert first.startswith("profiling"), first
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("hexiscale-profile-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # into the measurement
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.splitlines()[-1:] == ["error: interrupted"], (proc.returncode, err[-500:])
    assert not list(tmp_path.glob("hexiscale-profile-*")) and not (tmp_path / "c.yaml").exists()
