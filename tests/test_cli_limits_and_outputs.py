"""Time limits and outputs as a careless user meets them: a limit of inf, nan, 0 or -5 is one
line and exit 2 on every command that takes one (inf had crashed the heuristic's work count);
an output that cannot be written is one line and exit 2, before the solve where a try can tell
(root passes os.access everywhere, /proc included) and after it where only the write can (a full
disk); `frontier -o` keeps its limit; no blank lines on a stderr that is not a terminal. Each
test failed on the code before its fix."""

from __future__ import annotations

import math
import os
import sys

import pytest
from pathlib import Path
from typer.testing import CliRunner

import hexiscale as hx
import hexiscale.cli.frontier as frontier_mod
from hexiscale.cli import app
from tests.cli_checks import one_error_line
from planner.io import load_problem
from solvers.frontier import Frontier
from solvers.layered.heuristic.options import MAX_MOVE_EVALUATIONS, HeuristicOptions

PRICED = """name: priced-8
cluster:
  name: eight
  machines:
  - {name: a0, gpu: A100-80G, count: 1, intra_bw_gbps: 300, price_per_hour: 1.39}
  - {name: r0, gpu: RTX4090, count: 1, intra_bw_gbps: 16, price_per_hour: 0.34}
  - {name: t0, gpu: RTX3090, count: 1, intra_bw_gbps: 16, price_per_hour: 0.22}
  inter_bw_gbps: 3.125
model: tiny
training: {seq_len: 64, global_batch: 8, micro_batch: 1}
"""


COMMANDS = [["solve", "demo-tiny"], ["compare", "demo-tiny", "-s", "symmetric"],
            ["replan", "demo-tiny", "demo-tiny", "--lost", "1"], ["frontier", "PRICED"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("limit", ["inf", "1e308", "nan", "0", "-5", "604801"])
def test_a_time_limit_outside_a_week_is_one_line_on_every_command(no_solving, tmp_path, command, limit):
    (tmp_path / "p.yaml").write_text(PRICED)
    args = [str(tmp_path / "p.yaml") if a == "PRICED" else a for a in command]
    result = CliRunner().invoke(app, [*args, "-t", limit])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "--time-limit" in line and "604800 (one week)" in line


def test_the_exact_time_limit_is_checked_alike(no_solving):
    result = CliRunner().invoke(app, ["compare", "demo-tiny", "--exact-time-limit", "inf"])
    assert result.exit_code == 2 and "--exact-time-limit" in one_error_line(result)


def test_an_api_time_limit_of_inf_bounds_the_heuristic_s_work_by_a_week_s():
    """SolverOptions refuses an inf limit now (tests/test_api_entry_checks.py); the heuristic still bounds
    its work by a week's for any limit that reaches it."""
    assert HeuristicOptions().evaluations_for(math.inf) == MAX_MOVE_EVALUATIONS
    assert HeuristicOptions().evaluations_for(1e308) == MAX_MOVE_EVALUATIONS
    assert HeuristicOptions().evaluations_for(10.0) == 1600  # a finite limit as before
    result = hx.solve(load_problem("demo-tiny"), "heuristic", hx.SolverOptions(time_limit_s=7 * 24 * 3600.0))
    assert result.plan is not None and not hx.validate(load_problem("demo-tiny"), result.plan)


@pytest.mark.parametrize("args,option", [
    (["solve", "demo-tiny", "-o", "/proc/x.json"], "--output"),
    (["replan", "demo-tiny", "demo-tiny", "--lost", "1", "-o", "/proc/x.json"], "--output"),
    (["compare", "demo-tiny", "-s", "symmetric", "--csv", "/proc/rows.csv"], "--csv"),
    (["show", "demo-tiny", "demo-tiny", "-o", "/proc/pics"], "--out"),
    (["frontier", "PRICED", "-o", "/proc/f"], "--out"),
])
def test_an_output_root_cannot_write_is_refused_before_the_work(no_solving, tmp_path, args, option):
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    (tmp_path / "p.yaml").write_text(PRICED)
    args = [str(tmp_path / "p.yaml") if a == "PRICED" else a for a in args]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert option in line and "cannot write" in line
    assert not os.path.exists("/proc/pics") and not os.path.exists("/proc/f")


def test_the_early_check_leaves_nothing_behind(tmp_path):
    """The tries create the file and folders they need, and remove them again."""
    from hexiscale.cli.app import writable_file, writable_folder

    assert writable_file(tmp_path / "plan.json", "-o") == tmp_path / "plan.json"
    assert writable_folder(tmp_path / "a" / "b", "-o") == tmp_path / "a" / "b"
    (tmp_path / "kept.json").write_text("old")
    writable_file(tmp_path / "kept.json", "-o")
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"] and (tmp_path / "kept.json").read_text() == "old"


def test_a_file_where_the_folder_should_be_is_named_as_a_file(no_solving, tmp_path):
    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(app, ["solve", "demo-tiny", "-o", str(tmp_path / "afile" / "x.json")])
    assert result.exit_code == 2
    assert "afile is a file, not a folder" in one_error_line(result)


@pytest.mark.parametrize("args", [
    ["solve", "demo-tiny", "-t", "3", "-o", "/dev/full"],
    ["replan", "demo-tiny", "demo-tiny", "--lost", "1", "-t", "3", "-o", "/dev/full", "--problem-out", "SURV"],
    ["compare", "demo-tiny", "-s", "symmetric", "-t", "3", "--csv", "/dev/full"],
    ["compare", "demo-tiny", "-s", "symmetric", "-t", "3", "--json-file", "/dev/full"],
])
def test_a_write_that_fails_after_the_solve_is_one_line_and_exit_2(tmp_path, args):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    args = [str(tmp_path / "s.yaml") if a == "SURV" else a for a in args]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # after the progress lines
    assert errors == ["error: /dev/full: cannot write: No space left on device"]
    assert "Traceback" not in result.output and "internal error" not in result.output


def test_frontier_o_imports_matplotlib_before_the_solve_and_holds_back_the_picture(monkeypatch, tmp_path):
    """`frontier -o -t 3` ended at 3.3 s: matplotlib's import (0.3-0.6 s) came after the solve and
    the picture's part was cut to the 20 % share of the output. Now the import counts before the
    solver's share is set, and the picture's drawing is held back whole."""
    seen, budgets, real_budget = {}, [], frontier_mod.CommandBudget

    def recorded_budget(*args, **kwargs):  # the command's own clock: CliRunner's start-up is none of its
        budgets.append(real_budget(*args, **kwargs))  # budget (counted from the test's, it flaked by 0.04 s)
        return budgets[-1]

    def fake_frontier(problem, solve, *, time_limit_s, **kwargs):
        seen.update(imported="hexiscale.viz.frontier" in sys.modules, limit=time_limit_s,
                    elapsed=budgets[0].elapsed())
        return Frontier(solver="heuristic", exact=False)

    monkeypatch.delitem(sys.modules, "hexiscale.viz.frontier", raising=False)
    monkeypatch.setattr(frontier_mod.frontiers, "frontier", fake_frontier)
    monkeypatch.setattr(frontier_mod, "CommandBudget", recorded_budget)
    (tmp_path / "p.yaml").write_text(PRICED)
    result = CliRunner().invoke(app, ["frontier", str(tmp_path / "p.yaml"), "-t", "2", "-o", str(tmp_path / "f")])
    assert result.exit_code == 1  # the fake frontier has no point
    assert seen["imported"]
    # held back: the output (0.3 s + the plans) and the picture (0.3 s); before, 0.4 s in all at -t 2
    assert seen["limit"] + seen["elapsed"] <= 2.0 - 0.55


def test_a_solve_off_a_terminal_leaves_no_blank_lines_on_stderr(tmp_path):
    """The heuristics' bars, redrawn in place, wrote a blank line per redraw into `2>err.txt`."""
    result = CliRunner().invoke(app, ["solve", "small-8-llama2-7b", "-t", "4"])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() and all(line.strip() for line in result.stderr.splitlines()), repr(result.stderr)


def test_a_write_cut_short_leaves_the_old_file_whole(tmp_path, monkeypatch):
    """Plans, clusters, problems and compare tables are written through a temporary file renamed
    over the old one: a Ctrl-C (or a full disk) in the middle leaves the old file as it was and
    no temporary file beside it."""
    from planner import base
    from planner.io import load_plan, save_plan

    path = tmp_path / "plan.json"
    plan = load_plan("demo-tiny")
    save_plan(plan, path)
    before = path.read_text()

    def interrupted_replace(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(base.os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        save_plan(plan.model_copy(update={"problem": "another"}), path)
    assert path.read_text() == before and sorted(os.listdir(tmp_path)) == ["plan.json"]


def test_the_write_keeps_links_permissions_and_devices(tmp_path):
    """Renaming over a link would have put a file in its place, and over /dev/full a file in
    /dev (as root: it did, once, before this test): a link's target is replaced, a device
    written through, and a replaced file keeps its permissions."""
    from planner.base import write_atomically

    target = tmp_path / "real.yaml"
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    write_atomically(link, "new")
    assert link.is_symlink() and target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.yaml", "real.yaml"]
    if os.path.exists("/dev/full"):
        with pytest.raises(OSError, match="No space left"):
            write_atomically("/dev/full", "x")
        assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")
    # `-o /dev/stdout` into a pipe: the link's target, pipe:[N], is no path a file could be put at
    reader, writer = os.pipe()
    try:
        write_atomically(f"/proc/self/fd/{writer}", "through the pipe")
    finally:
        os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        assert pipe.read() == b"through the pipe"


def test_a_file_this_process_may_not_write_is_not_replaced(tmp_path, monkeypatch):
    """A rename in a writable folder replaces even a read-only file; the write is refused as an
    in-place write was (as root every file is writable, so the check is made to say no)."""
    from planner import base

    target = tmp_path / "kept.yaml"
    target.write_text("old")
    monkeypatch.setattr(base.os, "access", lambda path, how: False)
    monkeypatch.setattr(Path, "write_text", lambda self, text: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(PermissionError):
        base.write_atomically(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["kept.yaml"]
