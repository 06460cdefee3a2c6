"""The CLI as a careless user meets it: output paths checked before any work, bundled names
of every kind, a version, the GPU catalog, internal errors as one line with exit 3, and
progress lines when stderr is not a terminal. Each test failed on the code before its fix."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import hexiscale.cli.inspect as inspect_mod
from hexiscale.cli import app
from tests.cli_checks import one_error_line

MISSING = "/nonexistent-folder-hexiscale/sub"


@pytest.mark.parametrize("args,option", [
    (["solve", "demo-tiny", "-o", f"{MISSING}/plan.json"], "--output"),
    (["generate", "cluster", "--gpus", "8", "-o", f"{MISSING}/c.yaml"], "--output"),
    (["generate", "problem", "--gpus", "8", "-o", f"{MISSING}/p.yaml"], "--output"),
    (["compare", "demo-tiny", "-s", "symmetric", "--csv", f"{MISSING}/rows.csv"], "--csv"),
    (["compare", "demo-tiny", "-s", "symmetric", "--json-file", f"{MISSING}/rows.json"], "--json-file"),
])
def test_unwritable_output_is_refused_before_the_work(no_solving, args, option):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert option in line and "does not exist" in line


def test_output_that_is_a_folder_or_a_file_where_a_folder_is_needed(no_solving, tmp_path):
    result = CliRunner().invoke(app, ["solve", "demo-tiny", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder" in one_error_line(result)
    (tmp_path / "f").write_text("x")
    result = CliRunner().invoke(app, ["compare", "demo-tiny", "-s", "symmetric", "--plans", str(tmp_path / "f")])
    assert result.exit_code == 2 and "is a file" in one_error_line(result)
    result = CliRunner().invoke(app, ["show", "demo-tiny", "demo-tiny", "-o", str(tmp_path / "f")])
    assert result.exit_code == 2 and "is a file" in one_error_line(result)


def test_show_prefix_is_a_name_not_a_path_and_is_joined_with_a_dash(tmp_path):
    result = CliRunner().invoke(app, ["show", "demo-tiny", "demo-tiny", "-o", str(tmp_path), "--prefix", "a/b"])
    assert result.exit_code == 2 and "--prefix" in one_error_line(result)
    result = CliRunner().invoke(app, ["show", "demo-tiny", "demo-tiny", "-o", str(tmp_path), "--prefix", "cs"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cs-cluster.png", "cs-memory.png", "cs-schedule.png"]


@pytest.mark.parametrize("name,expect", [("hetero-1", "ok cluster hetero-1"), ("llama2-7b", "ok model"),
                                         ("demo-tiny", "ok problem demo-tiny")])
def test_validate_takes_a_bundled_name_of_any_kind(name, expect):
    result = CliRunner().invoke(app, ["validate", name])
    assert result.exit_code == 0, result.output
    assert expect in result.output


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("hexiscale 0.")


def test_instances_lists_the_gpu_catalog():
    result = CliRunner().invoke(app, ["instances", "--kind", "gpus"])
    assert result.exit_code == 0
    assert "A100-80G" in result.output and "MI300X" in result.output and "TFLOP/s" in result.output


def test_an_internal_error_is_one_line_with_exit_3(monkeypatch):
    def broken(problem, plan):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(inspect_mod, "evaluate_plan", broken)
    result = CliRunner().invoke(app, ["evaluate", "demo-tiny", "demo-tiny"])
    assert result.exit_code == 3
    line = one_error_line(result)
    assert "internal error" in line and "ZeroDivisionError" in line and "HEXISCALE_DEBUG=1" in line


def test_compare_prints_progress_lines_when_stderr_is_not_a_terminal():
    result = CliRunner().invoke(app, ["compare", "demo-tiny", "-s", "symmetric,heuristic", "-t", "5"])
    assert result.exit_code == 0, result.output
    assert "solving demo-tiny with symmetric" in result.stderr
    assert "solving demo-tiny with heuristic" in result.stderr


@pytest.mark.parametrize("command", ["validate", "evaluate", "show"])
def test_a_plan_for_another_problem_needs_force(command, tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("name: other\ncluster: demo-4\nmodel: tiny\ntraining: {seq_len: 64, global_batch: 8}\n")
    out = ["-o", str(tmp_path)] if command == "show" else []
    result = CliRunner().invoke(app, [command, str(other), "demo-tiny", *out])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "made for problem 'demo-tiny', not 'other'" in line and "--force" in line
    result = CliRunner().invoke(app, [command, str(other), "demo-tiny", *out, "--force"])
    assert result.exit_code == 0, result.output


def test_evaluate_summarises_large_plans_and_full_shows_every_stage(tmp_path):
    from instances.generate import generate_cluster, generated_problem, write_problem
    from planner import Pipeline, Plan, Stage, save_plan

    problem = generated_problem(generate_cluster(128, "A100-80G:1", 0), "llama2-70b", 4096, 8, 1, True)
    write_problem(problem, tmp_path / "p.yaml")
    # one pipeline of 80 one-layer stages: over the 64-stage threshold
    plan = Plan(problem=problem.name, pipelines=(
        Pipeline(batch=8, stages=tuple(Stage(devices=(d,), layers=1) for d in range(80))),))
    save_plan(plan, tmp_path / "plan.json")
    args = ["evaluate", str(tmp_path / "p.yaml"), str(tmp_path / "plan.json")]
    default = CliRunner().invoke(app, args)
    assert default.exit_code == 0, default.output
    assert "pipelines (T_pipe" in default.stdout and "stages (p.k" not in default.stdout
    full = CliRunner().invoke(app, [*args, "--full"])
    assert "stages (p.k" in full.stdout and full.stdout.count("\n") > 80


def test_a_hint_the_solver_cannot_use_is_reported():
    result = CliRunner().invoke(app, ["solve", "demo-tiny", "--hint", "demo-tiny", "-t", "5"])
    assert result.exit_code == 0, result.output
    assert "--hint is ignored: heuristic takes no warm start" in result.stderr
    result = CliRunner().invoke(app, ["solve", "demo-tiny", "--hint", "demo-tiny", "-s", "cpsat", "-t", "20"])
    assert result.exit_code == 0 and "--hint is ignored" not in result.stderr


def test_one_stage_is_not_written_as_stages():
    result = CliRunner().invoke(app, ["solve", "tiny-2-tiny", "-t", "5"])
    assert result.exit_code == 0 and "1 stage," in result.stdout and "1 stages" not in result.stdout


def test_compare_json_prints_rows_like_solve_json():
    import json

    result = CliRunner().invoke(app, ["compare", "demo-tiny", "-s", "symmetric,heuristic", "-t", "5", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)  # stdout is JSON only: no tables around it
    assert [r["solver"] for r in rows] == ["symmetric", "heuristic"] and all(r["iteration_s"] > 0 for r in rows)


def test_tiny_times_are_shown_in_a_unit_not_as_exponents():
    out = CliRunner().invoke(app, ["solve", "demo-tiny", "-t", "5"]).stdout
    assert "µs" in out and "e-0" not in out


def test_validate_and_show_of_a_large_plan_report_each_stage_on_stderr(tmp_path):
    from instances.generate import generate_cluster, generated_problem, write_problem
    from planner import Pipeline, Plan, Stage, save_plan

    problem = generated_problem(generate_cluster(1024, "A100-80G:1", 0), "llama2-7b", 1024, 8, 1, True)
    write_problem(problem, tmp_path / "p.yaml")
    plan = Plan(problem=problem.name, pipelines=(  # 4 one-device stages of 8 layers: fits in 80 GiB
        Pipeline(batch=8, stages=tuple(Stage(devices=(d,), layers=8) for d in range(4))),))
    save_plan(plan, tmp_path / "plan.json")
    args = [str(tmp_path / "p.yaml"), str(tmp_path / "plan.json")]
    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exit_code == 0, result.output
    assert "checking every rule on 4 devices …" in result.stderr and "\ndone (previous step" in result.stderr
    result = CliRunner().invoke(app, ["show", *args, "-o", str(tmp_path / "pics")])
    assert result.exit_code == 0, result.output
    for step in ("pricing the plan", "drawing cluster.png", "drawing schedule.png", "drawing memory.png"):
        assert step in result.stderr


def test_unnamed_inline_model_and_cluster_take_the_problem_s_name(tmp_path):
    path = tmp_path / "unnamed.yaml"
    path.write_text("cluster: {inter_bw_gbps: 10, machines: [{name: m0, gpu: A100-80G, count: 2, intra_bw_gbps: 300}]}\n"
                    "model: {layers: 2, hidden: 64, heads: 4, ffn_hidden: 128, vocab: 256}\n"
                    "training: {seq_len: 64, global_batch: 4}\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "model unnamed-model" in result.output and "model model" not in result.output


@pytest.mark.parametrize("args, message", [
    (["solve", "demo-asym", "-t", "abc"], "error: Invalid value for '--time-limit' / '-t'"),
    (["run", "demo-tiny", "demo-tiny", "--steps", "0"], "error: Invalid value for '--steps'"),
    (["solve"], "error: Missing argument 'problem'."),
    (["solve", "demo-asym", "--bogus"], "error: No such option: --bogus"),
])
def test_a_bad_option_is_one_error_line_naming_the_command_s_help(args, message):
    """typer drew a five-line box with the usage (app.one_line_usage_error); exit 2 as before."""
    out = CliRunner().invoke(app, args, prog_name="hexiscale")
    assert out.exit_code == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and out.stderr.startswith(message), out.stderr
    assert f"(hexiscale {args[0]} --help)" in out.stderr


@pytest.mark.parametrize("what", ["cluster", "problem"])
def test_generate_refuses_more_gpus_than_it_is_meant_for_before_any_work(tmp_path, what):
    """--gpus 10^9 ran silent for over a minute (2·10^6 wrote 29 MB): above MAX_GPUS it is one line."""
    from hexiscale.cli.generate import MAX_GPUS

    result = CliRunner().invoke(app, ["generate", what, "--gpus", str(MAX_GPUS + 4), "-o", str(tmp_path / "g.yaml")])
    assert result.exit_code == 2 and "--gpus" in result.output and f"{MAX_GPUS}" in result.output
    assert not (tmp_path / "g.yaml").exists()
