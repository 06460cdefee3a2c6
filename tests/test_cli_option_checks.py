"""Options and plans a command cannot use are refused in one line naming them, before any work
(found by a QA pass: each had been an internal error, a silent no-op or a message naming no file)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import load_plan

runner = CliRunner()


def one_error(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture
def broken_plan(tmp_path):
    """demo-tiny's plan with a device beyond its 4."""
    data = json.loads(load_plan("demo-tiny").to_json())
    data["pipelines"][1]["stages"][0]["devices"] = [4]
    path = tmp_path / "p4.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("command", [["solve", "demo-asym", "-t", "1"], ["frontier", "demo-asym", "-t", "1"],
                                     ["compare", "demo-asym", "-s", "heuristic", "-t", "1"]])
def test_a_seed_past_what_the_solvers_take_is_refused(command):
    """CP-SAT's seed is an int32, pymetis' and torch's a long: 2^63 was an internal error."""
    assert "--seed" in one_error(*command, "--seed", 2**63)


def test_a_hint_that_is_no_valid_plan_is_refused_naming_its_file_and_rule(broken_plan):
    line = one_error("solve", "demo-tiny", "-s", "cpsat", "--hint", broken_plan, "-t", "2")
    assert line.startswith(f"error: --hint: {broken_plan}: the plan is invalid for demo-tiny") and "[device]" in line


@pytest.mark.parametrize("command", [["run", "demo-tiny", "{plan}", "--steps", "1", "--out", "{out}"],
                                     ["run", "demo-tiny", "{plan}", "--torchrun", "--out", "{out}"],
                                     ["replan", "demo-tiny", "{plan}", "--lost", "3", "-o", "{out}.json"]])
def test_run_and_replan_name_the_invalid_plan_file(command, broken_plan, tmp_path):
    out = tmp_path / "out"
    line = one_error(*(a.format(plan=broken_plan, out=out) for a in command))
    assert line.startswith(f"error: {broken_plan}: plan is invalid for demo-tiny: [device]"), line
    assert not (out / "job.json").exists() and not out.with_suffix(".json").exists()


def test_a_negative_exact_device_limit_is_refused():
    assert "--exact-max-devices" in one_error("compare", "demo-asym", "-s", "heuristic", "--exact-max-devices", -1)


@pytest.mark.parametrize("args, words", [(["--seq-len", 10**8], "--seq-len: Input should be less than or equal to"),
                                         (["--global-batch", 10**16], "--global-batch:")])
def test_generate_problem_names_the_option_out_of_range(args, words, tmp_path):
    assert words in one_error("generate", "problem", "--gpus", 4, *args, "-o", tmp_path / "g.yaml")
