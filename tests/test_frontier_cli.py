"""`hexiscale frontier` (docs/frontier.md §5): the table, `--json` rows equal to brute force's
frontier on a tiny priced problem, the picture and each point's plan with `-o`, the heuristic's
budget levels, and one-line errors (no prices: exit 2; no plan: exit 1)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from instances.generate import write_problem
from instances.random_priced import random_priced
from planner.io import load_plan, load_problem
from planner.kinds import iteration_time, validate
from planner.prices import rent_per_hour
from planner.problem import Objective
from solvers.layered.exact import brute


@pytest.fixture
def tiny_priced(tmp_path):
    """random_priced(14) with objective time and no budget (four frontier points), as a file."""
    problem = random_priced(14).model_copy(update={"objective": Objective.time, "budget_per_hour": None})
    path = tmp_path / "priced.yaml"
    write_problem(problem, path)
    return path, load_problem(path)


def test_json_rows_are_brute_force_s_frontier(tiny_priced):
    path, problem = tiny_priced
    result = CliRunner().invoke(app, ["frontier", str(path), "--json", "-t", "120"])
    assert result.exit_code == 0, result.output
    rows, expected = json.loads(result.stdout), brute.frontier(problem)  # progress lines go to stderr
    assert "level 1 of at most" in result.stderr  # the exact descent: a point found drops the levels above it
    assert len(rows) == len(expected) == 4
    for row, point in zip(rows, expected):
        assert set(row) >= {"rent_per_hour", "iteration_s", "cost_per_mtok", "plan"} and row["proven"]
        assert math.isclose(row["rent_per_hour"], point.rent_per_hour, abs_tol=1e-12)
        assert math.isclose(row["iteration_s"], point.iteration_s, rel_tol=1e-6)
        assert math.isclose(row["cost_per_mtok"], point.cost_per_mtok, rel_tol=1e-6, abs_tol=1e-15)


def test_table_picture_and_plans(tiny_priced, tmp_path):
    path, problem = tiny_priced
    out = tmp_path / "front"
    result = CliRunner().invoke(app, ["frontier", str(path), "-o", str(out), "-t", "120"])
    assert result.exit_code == 0, result.output
    assert "per Mtok" in result.output and "★" in result.output and "every point proven" in result.output
    assert (out / "frontier.png").stat().st_size > 10_000
    plans = sorted(out.glob("frontier-*.json"))
    assert len(plans) == 4
    rents = [rent_per_hour(problem, load_plan(p)) for p in plans]
    times = [iteration_time(problem, load_plan(p)) for p in plans]
    assert all(validate(problem, load_plan(p)) == [] for p in plans)
    assert rents == sorted(rents) and times == sorted(times, reverse=True)


def test_heuristic_levels_say_so(tiny_priced):
    path, _ = tiny_priced
    result = CliRunner().invoke(app, ["frontier", str(path), "--solver", "heuristic", "--levels", "3", "-t", "30"])
    assert result.exit_code == 0, result.output
    assert "heuristic over 3 budget levels" in result.output
    # the summary counts the points the table marks proven (it had said "no point is proven" beside one)
    marked = sum(line.rstrip().endswith("proven") for line in result.output.splitlines())
    said = "no point proven" if not marked else f"{marked} of "
    assert said in " ".join(result.output.split()), result.output
    levels = [line for line in result.stderr.splitlines() if " of 3 (rent ≤ " in line]  # one line per level in a log
    assert [line.split(": level ")[1][:1] for line in levels] == ["1", "2", "3"]


def test_unpriced_cluster_is_one_line_exit_2():
    result = CliRunner().invoke(app, ["frontier", "tiny-2-tiny"])
    assert result.exit_code == 2
    assert "price_per_hour" in result.output and "Traceback" not in result.output


def test_a_budget_no_plan_fits_exits_1(tmp_path):
    problem = random_priced(7)  # machine rents 0.1, 3.7 and 10.8 per hour: none free
    cheapest = float(problem.cluster.machine_rent.min())
    problem = problem.model_copy(update={"objective": Objective.time, "budget_per_hour": cheapest * 0.5})
    path = tmp_path / "tight.yaml"
    write_problem(problem, path)
    result = CliRunner().invoke(app, ["frontier", str(path), "-t", "30"])
    assert result.exit_code == 1, result.output
    assert "no plan on the frontier" in result.output


def test_the_default_solver_is_exact_only_where_the_kind_s_exact_models_take_the_problem(tmp_path):
    """8 GPUs at 128K tokens: a sequence problem, past the sequence exact model's 6 devices; the
    default had picked cpsat by the device count alone and found no frontier (exit 1)."""
    path = tmp_path / "g8.yaml"
    made = CliRunner().invoke(app, ["generate", "problem", "--gpus", "8", "--prices", "--seq-len", "131072",
                                    "--model", "llama3-8b", "--global-batch", "4", "-o", str(path)])
    assert made.exit_code == 0, made.output
    result = CliRunner().invoke(app, ["frontier", str(path), "--levels", "2", "-t", "20"])
    assert result.exit_code == 0, result.output
    assert "solved by heuristic" in " ".join(result.output.split())
