"""`hexiscale compare`: rows judged by the evaluator, gap and speed-up computed from the other
rows, exact solvers skipped on big clusters, CSV/JSON written, bad input one line."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

import hexiscale.cli.compare as compare_mod
from hexiscale.cli import app
from planner import evaluate, load_plan
from planner.io import load_problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.registry import solve as real_solve


def test_csv_json_and_saved_plans_agree_with_the_evaluator(tmp_path):
    args = ["compare", "small-8-llama2-7b", "--solvers", "symmetric,symmetric-all",
            "--csv", str(tmp_path / "rows.csv"), "--json-file", str(tmp_path / "rows.json"), "--plans", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "small-8-llama2-7b" in result.output and "symmetric-all" in result.output
    rows = json.loads((tmp_path / "rows.json").read_text())
    with open(tmp_path / "rows.csv") as fh:
        csv_rows = list(csv.DictReader(fh))
    assert [r["solver"] for r in rows] == [r["solver"] for r in csv_rows] == ["symmetric", "symmetric-all"]
    problem = load_problem("small-8-llama2-7b")
    for row in rows:
        plan = load_plan(tmp_path / f"small-8-llama2-7b.{row['solver']}.json")
        est = evaluate(problem, plan)
        assert row["iteration_s"] == pytest.approx(est.iteration_s, rel=1e-12)
        assert row["mfu"] == pytest.approx(est.mfu, rel=1e-12)
        assert float(next(c for c in csv_rows if c["solver"] == row["solver"])["iteration_s"]) == pytest.approx(
            est.iteration_s, rel=1e-9)
    sym, every = rows
    assert sym["speedup"] == pytest.approx(1.0)
    assert every["speedup"] == pytest.approx(sym["iteration_s"] / every["iteration_s"], rel=1e-12)
    assert sym["gap"] is None  # no solver proved a bound


def test_gap_uses_the_tightest_bound_of_any_solver(monkeypatch):
    """Two fake exact solvers report bounds; the gap of every row is against the larger one."""
    problem = load_problem("small-8-llama2-7b")
    t_sym = real_solve(problem, "symmetric").objective_s

    def fake_solve(prob, name, options):
        if name in ("fake-a", "fake-b"):
            bound = t_sym * (0.5 if name == "fake-a" else 0.8)
            return SolveResult(solver=name, status=SolveStatus.unknown, bound_s=bound, wall_s=0.0)
        return real_solve(prob, name, options)

    monkeypatch.setattr(compare_mod, "solve", fake_solve)
    rows = compare_mod.compare_problem(problem, ["fake-a", "symmetric", "fake-b"], SolverOptions())
    by_name = {r.solver: r for r in rows}
    assert by_name["symmetric"].gap == pytest.approx(0.2)  # (T − 0.8·T) / T
    assert by_name["fake-a"].iteration_s is None and by_name["fake-a"].gap is None
    assert by_name["fake-b"].status == "unknown"


def test_exact_solvers_are_skipped_on_big_clusters_and_crashes_become_rows(monkeypatch):
    problem = load_problem("small-8-llama2-7b")
    called = []

    def fake_solve(prob, name, options):
        called.append(name)
        if name == "boom":
            raise RuntimeError("solver fell over")
        return real_solve(prob, name, options)

    monkeypatch.setattr(compare_mod, "solve", fake_solve)
    rows = compare_mod.compare_problem(problem, ["cpsat", "boom"], SolverOptions(), exact_max_devices=4)
    assert [r.status for r in rows] == ["skipped", "error"]
    assert "cpsat" not in called and "solver fell over" in rows[1].message
    assert called[-1] == "symmetric"  # the speed-up reference is computed even when not asked for


def test_unknown_solver_and_missing_problem_fail_with_one_line():
    runner = CliRunner()
    bad_solver = runner.invoke(app, ["compare", "small-8-llama2-7b", "--solvers", "symmetric,nope"])
    assert bad_solver.exit_code == 2 and "nope" in bad_solver.output
    missing = runner.invoke(app, ["compare", "no-such-problem", "--solvers", "symmetric"])
    assert missing.exit_code == 2 and "Traceback" not in missing.output


def test_saved_plans_of_a_problem_named_with_a_slash(tmp_path):
    """'--plans' wrote '<name>.<solver>.json', a path into a folder named after the name's first
    part: exit 2 'cannot write'. The name's '/' is escaped in the file's name."""
    from planner.io import problem_to_dict, save_yaml
    problem = tmp_path / "p.yaml"
    save_yaml(problem_to_dict(load_problem("small-8-llama2-7b")) | {"name": "team/small-8"}, problem)
    result = CliRunner().invoke(app, ["compare", str(problem), "--solvers", "symmetric", "--plans", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert load_plan(tmp_path / "team%2Fsmall-8.symmetric.json").problem == "team/small-8"
