"""Outputs over the command's own inputs, or over each other, as a QA pass found them: `solve
p.yaml -o p.yaml` replaced the problem with the plan (exit 0), and so did replan, compare,
generate and export-hf with theirs; compare wrote one row twice for a solver named twice, and
one --plans file for two problems of one name; a frontier into a folder used before left the
earlier frontier's extra plans there. Each refusal is one line naming the option and the path,
exit 2, before any solve, and leaves the input's bytes as they were (docs/cli.md, Conventions)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_checks import one_error_line
from hexiscale.cli import app
from hexiscale.cli.compare_files import check_plan_files
from hexiscale.cli.paths import nested, same_file
from instances.generate import write_problem
from instances.random_priced import random_priced
from planner.io import bundled_dir, load_plan, load_problem, problem_to_dict
from planner.problem import Objective


def cli(*args):
    return CliRunner().invoke(app, [*map(str, args)])


def refused(result, option: str, path) -> str:
    """The one error line, exit 2, naming the option and the path."""
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert f"{option}:" in line and str(path) in line, line
    return line


def bundled_copy(kind: str, name: str, folder: Path, as_name: str | None = None) -> Path:
    """A bundled problem, plan or model as a file of this test's own."""
    source = next(p for p in bundled_dir(kind).glob(f"{name}.*"))
    return Path(shutil.copy(source, folder / (as_name or source.name)))


@pytest.fixture
def files(tmp_path, monkeypatch):
    """demo-tiny's problem and plan as files in the current folder (relative paths as typed)."""
    monkeypatch.chdir(tmp_path)
    problem, plan = bundled_copy("problems", "demo-tiny", tmp_path), bundled_copy("plans", "demo-tiny", tmp_path)
    return Path(problem.name), Path(plan.name)


def unchanged(*paths: Path) -> dict[Path, bytes]:
    """The bytes of each file, taken before the command and again after it."""
    return {path: path.read_bytes() for path in paths}


# solve


@pytest.mark.parametrize("spelling", ["same", "dotted", "link"])
def test_solve_refuses_to_write_the_plan_over_the_problem(files, no_solving, spelling):
    problem, _ = files
    output = {"same": problem, "dotted": Path(".") / ".." / Path.cwd().name / problem, "link": Path("p-link.yaml")}
    if spelling == "link":
        output[spelling].symlink_to(problem)  # a write renamed over the link's target would replace the problem
    before = unchanged(problem)
    line = refused(cli("solve", problem, "-t", 2, "-o", output[spelling]), "--output", output[spelling])
    assert "the problem file read" in line
    assert unchanged(problem) == before


def test_solve_refuses_to_write_the_plan_over_its_hint(files, no_solving):
    problem, plan = files
    before = unchanged(plan)
    line = refused(cli("solve", problem, "-s", "cpsat", "--hint", plan, "-t", 2, "-o", plan), "--output", plan)
    assert "--hint" in line and unchanged(plan) == before


# replan


@pytest.mark.parametrize("outputs, option, refused_path, what", [
    (["-o", "{plan}"], "--output", "{plan}", "the plan file read"),
    (["-o", "new.json", "--problem-out", "{problem}"], "--problem-out", "{problem}", "the problem file read"),
    (["--problem-out", "{plan}"], "--problem-out", "{plan}", "the plan file read"),
    (["-o", "same.json", "--problem-out", "same.json"], "--problem-out", "same.json", "the --output plan file"),
])
def test_replan_refuses_outputs_over_its_inputs_or_each_other(files, no_solving, outputs, option, refused_path, what):
    problem, plan = files
    args = [a.format(problem=problem, plan=plan) for a in outputs]
    before = unchanged(problem, plan)
    line = refused(cli("replan", problem, plan, "--lost", 3, "-t", 2, *args), option,
                   refused_path.format(problem=problem, plan=plan))
    assert what in line
    assert unchanged(problem, plan) == before and not Path("same.json").exists() and not Path("new.json").exists()


def test_replan_refuses_a_plan_named_as_the_survivors_problem_beside_it(files, no_solving):
    """The survivors' problem goes to demo-tiny-without-3.yaml beside the plan: a plan of that name
    was written over the problem just written."""
    problem, plan = files
    line = refused(cli("replan", problem, plan, "--lost", 3, "-t", 2, "-o", "demo-tiny-without-3.yaml"),
                   "--output", "demo-tiny-without-3.yaml")
    assert "--problem-out" in line and not Path("demo-tiny-without-3.yaml").exists()


# compare


@pytest.mark.parametrize("option", ["--csv", "--json-file"])
def test_compare_refuses_a_table_over_the_problem(files, no_solving, option):
    problem, _ = files
    before = unchanged(problem)
    line = refused(cli("compare", problem, "-s", "heuristic,symmetric", "-t", 2, option, problem), option, problem)
    assert "a problem file read" in line and unchanged(problem) == before


def test_compare_refuses_both_tables_in_one_file(files, no_solving):
    problem, _ = files
    line = refused(cli("compare", problem, "-s", "heuristic", "-t", 2, "--csv", "out.x", "--json-file", "out.x"),
                   "--json-file", "out.x")
    assert "the --csv file" in line and not Path("out.x").exists()


@pytest.mark.parametrize("solvers, said", [("heuristic,heuristic", "heuristic is named twice"),
                                           ("heuristic,layered:heuristic", "heuristic and layered:heuristic")])
def test_compare_refuses_a_solver_named_twice(files, no_solving, solvers, said):
    problem, _ = files
    line = refused(cli("compare", problem, "-s", solvers, "-t", 2), "--solvers", said)
    assert "give each solver once" in line


def test_compare_refuses_two_problems_of_one_name_writing_one_plans_file(files, no_solving, tmp_path):
    """Both files say `name: demo-tiny`; the second has another batch: its plans would replace
    the first's demo-tiny.heuristic.json."""
    problem, _ = files
    other = Path("other.yaml")
    other.write_text(problem.read_text().replace("global_batch: 8", "global_batch: 16"))
    line = refused(cli("compare", problem, other, "-s", "heuristic", "-t", 2, "--plans", "plans"), "--plans", problem)
    assert str(other) in line and "demo-tiny" in line and not list(tmp_path.glob("plans/*.json"))


def test_the_same_problem_twice_may_share_its_plans_files(files):
    """Given twice (two copies of one file), a problem's plans are the same problem's: no refusal."""
    problem, _ = files
    copy = Path(shutil.copy(problem, "copy.yaml"))
    loaded = [load_problem(problem), load_problem(copy)]
    assert problem_to_dict(loaded[0]) == problem_to_dict(loaded[1])
    check_plan_files(Path("plans"), [str(problem), str(copy)], loaded, [("layered", ["heuristic"])] * 2, [])


def test_compare_refuses_a_plans_file_over_the_problem(tmp_path, monkeypatch, no_solving):
    """--plans DIR where DIR holds the problem file under the name a plan gets (PROBLEM.SOLVER.json)."""
    monkeypatch.chdir(tmp_path)
    Path("plans").mkdir()
    problem = Path("plans/demo-tiny.heuristic.json")
    problem.write_text(json.dumps(problem_to_dict(load_problem("demo-tiny"))))
    before = unchanged(problem)
    line = refused(cli("compare", problem, "-s", "heuristic", "-t", 2, "--plans", "plans"), "--plans", problem)
    assert "a problem file read" in line and unchanged(problem) == before


# generate


def test_generate_refuses_to_write_the_problem_over_its_model_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = bundled_copy("models", "tiny", tmp_path, "mm.yaml").relative_to(tmp_path)
    before = unchanged(model)
    line = refused(cli("generate", "problem", "--gpus", 4, "--model", model, "-o", model), "--output", model)
    assert "the --model file read" in line and unchanged(model) == before


@pytest.mark.parametrize("spelling", ["hf:{folder}", "hf:{folder}/config.json"])
def test_generate_refuses_to_write_over_the_hugging_face_config_read(tmp_path, spelling):
    folder = tmp_path / "hf"
    folder.mkdir()
    config = folder / "config.json"
    config.write_text('{"model_type": "llama"}\n')
    before = unchanged(config)
    refused(cli("generate", "problem", "--gpus", 4, "--model", spelling.format(folder=folder), "-o", config),
            "--output", config)
    assert unchanged(config) == before


# export-hf


@pytest.fixture
def checkpoints(tmp_path):
    """A checkpoint folder as `run --checkpoint-dir` leaves it (the refusal reads none of it)."""
    root = tmp_path / "ck"
    (root / "step-00000002").mkdir(parents=True)
    (root / "step-00000002" / "rank0.pt").write_bytes(b"weights")
    (root / "step-00000002" / "manifest.json").write_text("{}\n")
    return root


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where, said", [(".", "is the checkpoint folder read"),
                                         ("step-00000002", "is inside the checkpoint folder read"),
                                         ("step-00000002/hf", "is inside the checkpoint folder read"),
                                         ("..", "holds the checkpoint folder read")])
def test_export_hf_refuses_a_folder_at_inside_or_around_the_checkpoints(checkpoints, where, said):
    before, output = tree(checkpoints.parent), checkpoints / where
    existed = output.exists()
    line = refused(cli("export-hf", checkpoints, "-o", output), "--output", output)
    assert said in line and tree(checkpoints.parent) == before and output.exists() == existed


# frontier


@pytest.fixture
def priced(tmp_path):
    """A 4-device priced problem whose exact frontier has 4 points, in a second or two."""
    problem = random_priced(14).model_copy(update={"objective": Objective.time, "budget_per_hour": None})
    write_problem(problem, tmp_path / "priced.yaml")
    return tmp_path / "priced.yaml"


def test_frontier_removes_the_plans_an_earlier_frontier_left_past_its_points(priced, tmp_path):
    out = tmp_path / "front"
    out.mkdir()
    for name in ("frontier-2.json", "frontier-5.json", "frontier-12.json", "notes.json"):
        (out / name).write_text("{}\n")  # an earlier frontier's (5 and 12 past this one's 4), and the user's
    result = cli("frontier", priced, "-o", out, "-t", 20, "--json")
    assert result.exit_code == 0, result.output
    points = len(json.loads(result.stdout))
    assert points == 4
    assert sorted(p.name for p in out.glob("frontier-*.json")) == [f"frontier-{k}.json" for k in range(1, 5)]
    assert all(load_plan(out / f"frontier-{k}.json") for k in range(1, 5))  # the earlier frontier-2 replaced
    assert (out / "notes.json").read_text() == "{}\n"
    note = [line for line in result.stderr.splitlines() if line.startswith("note: removed")]
    assert note == [f"note: removed from {out} an earlier frontier's plans that this one (4 plans) does not write: "
                    "frontier-5.json, frontier-12.json"]


def test_frontier_refuses_a_problem_file_among_its_outputs(priced, tmp_path, no_solving):
    out = tmp_path / "front"
    out.mkdir()
    problem = out / "frontier-9.json"  # past the points: it would be removed as an earlier frontier's plan
    problem.write_text(json.dumps(problem_to_dict(load_problem(priced))))
    before = unchanged(problem)
    line = refused(cli("frontier", problem, "-o", out, "-t", 5), "--out", out)
    assert str(problem) in line and unchanged(problem) == before


# the comparison of paths


def test_paths_are_compared_as_files(tmp_path):
    original = tmp_path / "a.yaml"
    original.write_text("x")
    os.link(original, tmp_path / "hard.yaml")
    assert same_file(tmp_path / "hard.yaml", original)
    assert same_file(tmp_path / "new.json", tmp_path / "sub" / ".." / "new.json")  # neither there yet
    assert not same_file(tmp_path / "new.json", original)
    assert nested(tmp_path / "x" / "y", tmp_path) and nested(tmp_path, tmp_path)
    assert not nested(tmp_path, tmp_path / "x") and not nested(tmp_path / "xy", tmp_path / "x")
