"""`hexiscale replan` as QA met it: the survivors' problem is named by the devices lost (two
replans that lost as many devices wrote one `<problem>-minus<k>.yaml`, and the earlier plan was
then judged on the later survivors with exit 0); no valid plan on the survivors is exit 1, as
for `solve`; the messages say why (a repaired plan's broken rule, ids ≥ 0). Each test failed on
the code before its fix."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli_checks import one_error_line
from hexiscale.cli import app
from planner.base import MAX_NAME, file_stem
from planner.io import load_plan, load_problem, problem_to_dict, save_yaml
from solvers.replan import MAX_NAME_BYTES, survivors, survivors_name

# demo-asym's three-stage plan (devices 0,1 | 3 | 2): the heuristic's, written out
DEMO_ASYM_PLAN = {"format": "hexiscale.plan/1", "problem": "demo-asym", "pipelines": [
    {"batch": 16, "stages": [{"devices": [0, 1], "layers": 9}, {"devices": [3], "layers": 1},
                             {"devices": [2], "layers": 2}]}]}


@pytest.fixture
def asym_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(DEMO_ASYM_PLAN))
    return path


def test_the_survivors_name_says_which_devices_were_lost():
    problem = load_problem("small-8-llama2-7b")
    assert survivors_name("p", {8, 0, 1, 2, 3}) == "p-without-0-3,8"
    assert survivors(problem, {1, 2})[0].name == "small-8-llama2-7b-without-1-2"
    assert survivors(problem, {1, 5})[0].name != survivors(problem, {1, 2})[0].name  # as many lost, other ids


def test_two_replans_losing_as_many_devices_keep_their_own_problems(tmp_path, asym_plan):
    runner = CliRunner()
    for lost, out in (("3", "a.json"), ("1", "b.json")):
        result = runner.invoke(app, ["replan", "demo-asym", str(asym_plan), "--lost", lost, "-o", str(tmp_path / out),
                                     "-t", "5"])
        assert result.exit_code == 0, result.output
    a, b = load_plan(tmp_path / "a.json"), load_plan(tmp_path / "b.json")
    assert (a.problem, b.problem) == ("demo-asym-without-3", "demo-asym-without-1")
    for plan, out in ((a, "a.json"), (b, "b.json")):  # each plan names the file written for it, and is judged by it
        problem_file = tmp_path / f"{plan.problem}.yaml"
        assert load_problem(problem_file).name == plan.problem
        judged = runner.invoke(app, ["evaluate", str(problem_file), str(tmp_path / out)])
        assert judged.exit_code == 0, judged.output
    crossed = runner.invoke(app, ["evaluate", str(tmp_path / "demo-asym-without-1.yaml"), str(tmp_path / "a.json")])
    assert crossed.exit_code == 2 and "--force" in crossed.output  # the other replan's survivors: refused


def test_an_existing_file_of_another_problem_is_not_overwritten(tmp_path, asym_plan, monkeypatch):
    import hexiscale.cli.replan as replan_mod

    edited = tmp_path / "demo-asym-without-3.yaml"
    edited.write_text("name: demo-asym-without-3\ncluster: tiny-2\nmodel: tiny\ntraining: {seq_len: 64, global_batch: 8}\n")
    monkeypatch.setattr(replan_mod, "replan_plan", lambda *a, **k: pytest.fail("solved before refusing the file"))
    result = CliRunner().invoke(app, ["replan", "demo-asym", str(asym_plan), "--lost", "3",
                                      "-o", str(tmp_path / "new.json"), "-t", "5"])
    assert result.exit_code == 2 and "--problem-out" in result.output, result.output
    assert "cluster: tiny-2" in edited.read_text() and not (tmp_path / "new.json").exists()


def test_no_valid_plan_on_the_survivors_is_exit_1(asym_plan):
    result = CliRunner().invoke(app, ["replan", "demo-asym", str(asym_plan), "--lost", "0,2", "-t", "5"])
    assert result.exit_code == 1, result.output
    assert "no valid plan on the 2 surviving devices" in result.output and "model states need" in result.output


def test_an_invalid_repaired_plan_says_why(asym_plan):
    """Device 3 held a whole stage: the repair drops its one pipeline, so nothing of it is left."""
    result = CliRunner().invoke(app, ["replan", "demo-asym", str(asym_plan), "--lost", "3", "-t", "5"])
    assert result.exit_code == 0, result.output
    assert "repaired old plan invalid (no pipeline of the old plan survived whole)" in result.output


def test_a_negative_device_id_is_said_to_be_below_zero():
    result = CliRunner().invoke(app, ["replan", "demo-tiny", "demo-tiny", "--lost", "-1"])
    assert result.exit_code == 2 and "device ids are integers ≥ 0, got -1" in result.output


def test_many_scattered_lost_ids_still_make_a_short_distinct_name():
    every_other, shifted = set(range(0, 400, 2)), set(range(1, 400, 2))
    names = {survivors_name("p", every_other), survivors_name("p", shifted)}
    assert len(names) == 2 and all(len(n) < 100 for n in names)
    assert survivors_name("p", every_other).startswith("p-without-200-devices-")


@pytest.mark.parametrize("args, message", [
    (["--lost", "3,3"], "--lost: device 3 is named twice"),  # had re-planned as if only 3 were named
    (["--lost", "1,3,01"], "--lost: device 1 is named twice"),
    (["--lost-machines", "r3090-0,r3090-0"], "--lost-machines: machine 'r3090-0' is named twice"),
    (["--lost-machines", "1,r3090-0"], "--lost-machines: machine 'r3090-0' is named twice (as '1' and 'r3090-0')"),
    # a device of a machine also lost whole: named twice as well (had been merged without a word)
    (["--lost", "3", "--lost-machines", "r3090-0"],
     "--lost: device 3 is on machine r3090-0, which --lost-machines names whole: name each lost device once"),
    # digits to str.isdigit that are no integers here: '²' had ended in an internal error, '٣' was device 3
    (["--lost", "²"], "--lost: device ids are integers ≥ 0, got ²"),
    (["--lost", "٣"], "--lost: device ids are integers ≥ 0, got ٣"),
    (["--lost-machines", "²"], "--lost-machines: machine '²' is not in the cluster (machines: r4090-0, r3090-0)"),
    (["--lost", "3,,4"], "--lost: expected a comma-separated list without empty items, got '3,,4'"),  # had been 3, 4
])
def test_a_repeated_or_odd_lost_id_is_refused_before_the_solve(args, message, monkeypatch):
    import hexiscale.cli.replan as replan_mod

    monkeypatch.setattr(replan_mod, "replan_plan", lambda *a, **k: pytest.fail("solved before refusing the repeat"))
    result = CliRunner().invoke(app, ["replan", "demo-tiny", "demo-tiny", *args, "-t", "5"])
    assert result.exit_code == 2 and one_error_line(result) == f"error: {message}"


def long_named(tmp_path, name: str) -> tuple[str, str]:
    """demo-tiny and its bundled plan, the problem renamed `name` (the plan names it too)."""
    problem, plan = tmp_path / "long.yaml", tmp_path / "long-plan.json"
    save_yaml(problem_to_dict(load_problem("demo-tiny")) | {"name": name}, problem)
    plan.write_text(json.dumps(json.loads(load_plan("demo-tiny").model_dump_json()) | {"problem": name}))
    return str(problem), str(plan)


@pytest.mark.parametrize("lost", ["0,1,3", "1,3"])
def test_a_long_problem_names_survivors_read_back_from_their_file(tmp_path, lost):
    """A 190-character problem name (a file allows 200) and the lost ids: the survivors' problem
    was named past 200 characters, and neither its file nor the plan naming it read back."""
    runner = CliRunner()
    problem, plan = long_named(tmp_path, "hexiscale-" * 19)
    out = tmp_path / "new.json"
    result = runner.invoke(app, ["replan", problem, plan, "--lost", lost, "-o", str(out), "-t", "5"])
    assert result.exit_code == 0, result.output
    name = json.loads(out.read_text())["problem"]  # read as written: load_plan refused it
    survivors_file = tmp_path / f"{name}.yaml"  # the file is named as the problem it holds
    for command in ("validate", "evaluate"):
        judged = runner.invoke(app, [command, str(survivors_file), str(out)])
        assert judged.exit_code == 0, judged.output
    assert load_problem(survivors_file).name == name == load_plan(out).problem
    assert len(name) == MAX_NAME and name.startswith("hexiscale-" * 15) and "…-without-" in name


def test_a_cut_survivors_name_keeps_distinct_losses_and_problems_apart():
    long, other = "p" * 195, "p" * 194 + "q"  # alike in every character a cut name keeps
    names = {survivors_name(n, lost) for n in (long, other) for lost in ({3}, {4}, {3, 4}, set(range(0, 400, 2)))}
    assert len(names) == 8 and all(len(n) <= MAX_NAME for n in names)
    assert survivors_name(long, {3}) == survivors_name(long, {3})  # the same file for the same loss
    assert survivors_name("p" * 190, {3}) == "p" * 190 + "-without-3"  # what fits is not cut
    wide = survivors_name("模" * 190, {1, 2})  # 3 bytes each: the file name's bytes bind first
    assert len(wide.encode()) <= MAX_NAME_BYTES and wide.startswith("模" * 50)


def test_a_problem_name_with_a_slash_gets_a_file_of_its_own(tmp_path):
    """'llama/7b' named the survivors' file 'llama/7b-without-1.yaml', a path into a folder that
    does not exist: exit 3, internal error. The file's name now escapes '/', '\\' and '%'."""
    runner = CliRunner()
    problem, plan = long_named(tmp_path, "llama/7b%")
    out = tmp_path / "new.json"
    result = runner.invoke(app, ["replan", problem, plan, "--lost", "1", "-o", str(out), "-t", "5"])
    assert result.exit_code == 0, result.output
    survivors_file = tmp_path / "llama%2F7b%25-without-1.yaml"
    assert load_problem(survivors_file).name == "llama/7b%-without-1" == load_plan(out).problem
    judged = runner.invoke(app, ["evaluate", str(survivors_file), str(out)])
    assert judged.exit_code == 0, judged.output


def test_file_stems_of_distinct_names_are_distinct():
    names = ["a/b", "a%2Fb", "a\\b", "a%5Cb", "a_b", "a%b", "a%25b"]
    assert len({file_stem(n) for n in names}) == len(names)
    assert all("/" not in file_stem(n) and "\\" not in file_stem(n) for n in names)


@pytest.mark.parametrize("name", ["a/" * 5 + "é" * 115, "/" * 100])
def test_a_name_whose_file_name_grows_past_255_bytes_is_cut_to_fit(tmp_path, name):
    """'/' is 3 bytes in the file's name (%2F): a name within 250 bytes made a file name over
    255 and replan ended in an internal error (OSError: File name too long)."""
    runner = CliRunner()
    problem, plan = long_named(tmp_path, name)
    out = tmp_path / "new.json"
    result = runner.invoke(app, ["replan", problem, plan, "--lost", "1", "-o", str(out), "-t", "5"])
    assert result.exit_code == 0, result.output
    written = load_plan(out).problem
    assert len(file_stem(written).encode()) <= MAX_NAME_BYTES
    assert load_problem(tmp_path / f"{file_stem(written)}.yaml").name == written


def test_a_plan_of_many_stages_is_outlined_in_a_short_line(tmp_path, asym_plan):
    """replan's 'plan: … → …' line listed every stage's TP: 37 KB at 10^5 GPUs. Past 16 stages
    (groups) the outline counts the sizes instead; a paste-able command is never wrapped."""
    from planner.base import sizes_phrase
    from planner.layered.plan import Pipeline, Plan, Stage, outline
    from planner.sequence.plan import outline as seq_outline

    assert sizes_phrase([2, 1, 1]) == "2/1/1"
    assert sizes_phrase([4] * 18_000 + [2] * 559 + [8]) == "8 ×1 · 4 ×18,000 · 2 ×559"
    many = Plan(problem="p", pipelines=[Pipeline(batch=1, stages=[Stage(devices=[d], layers=1)]) for d in range(40)])
    assert outline(many) == "D=40, 40 stages, 40 devices, TP 1 ×40"
    assert seq_outline(load_plan("longctx-tiny")).startswith("D=")
    result = CliRunner().invoke(app, ["replan", "demo-asym", str(asym_plan), "--lost", "3", "-o",
                                      str(tmp_path / ("a" * 60 + ".json"))], terminal_width=80)
    line = next(line for line in result.output.splitlines() if "judge it with" in line)
    assert line.endswith(".json") and "hexiscale evaluate" in line, result.output


def test_a_fresh_solve_without_a_plan_says_why():
    """`replan --solver cpsat` of a 32-device sequence plan printed 'fresh solve no plan' and no
    reason (solve prints the exact model's size limit); and the re-planning time, in brackets
    after the chosen candidate, read as a contradicting T."""
    from solvers.common import SolverOptions
    from solvers.registry import get
    from solvers.replan import replan

    problem = load_problem("longctx-sim-32-llama3-8b-128k")
    plan = get("seq-uniform", "sequence")(problem, SolverOptions(time_limit_s=10)).plan
    result = replan(problem, plan, lost=[16], solver="cpsat", options=SolverOptions(time_limit_s=10))
    assert result.fresh_s is None and "handles ≤ 6 devices" in result.fresh_why
    from hexiscale.cli.replan import print_result
    from hexiscale.cli.app import console

    with console.capture() as captured:
        print_result(result)
    text = " ".join(captured.get().split())
    assert f"fresh solve no plan ({result.fresh_why})" in text and "(re-planned in " in text
