"""The problem's objective (docs/prices.md §13) in what the commands choose and say: machine sets
that tie in T are told apart by rent (a dearer twin had won by its index); under `objective:
cost` the kind is chosen, argued and reported by the cost per token, idle machines are argued in
it and `compare` marks the cheapest row; `compare` shows every solver's name whole at 80
columns; a budget no set meets reports the registry's solver name. Each test failed on the code
before its fix."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

import solvers.choose as choose
from hexiscale.cli import app
from hexiscale.cli.compare import ComparisonRow, comparison_table
from planner.io import load_problem
from planner.layered.plan import Plan
from planner.prices import cost_per_mtok
from planner.sequence.plan import SeqPlan
from solvers.common import SolveResult, SolverOptions
from solvers.layered.exact.driver import _seconds
from planner.solver_info import SolveStatus

# two identical one-GPU machines, the cheaper listed first: the rental sets list the dearer first
TWINS = """name: twins
cluster:
  name: two-4090
  machines:
  - {name: r0, gpu: RTX4090, count: 1, intra_bw_gbps: 16, price_per_hour: 0.34}
  - {name: r1, gpu: RTX4090, count: 1, intra_bw_gbps: 16, price_per_hour: 0.36}
  inter_bw_gbps: 3.125
model: tiny
training: {seq_len: 64, global_batch: 8, micro_batch: 1}
"""

# two H100 at $6/h and two A100 at $1.4/h each, the tiny model at 1,024 tokens (both kinds have plans)
LONG = """name: long-cost
cluster:
  name: lc
  inter_bw_gbps: 25
  machines:
  - {name: h100-0, gpu: H100, count: 2, intra_bw_gbps: 450, price_per_hour: 6.0}
  - {name: a100-0, gpu: A100-80G, count: 1, intra_bw_gbps: 300, price_per_hour: 1.4}
  - {name: a100-1, gpu: A100-80G, count: 1, intra_bw_gbps: 300, price_per_hour: 1.4}
model: tiny
training: {seq_len: 1024, global_batch: 2, micro_batch: 1, recompute: true, token_block: 64}
"""


@pytest.mark.parametrize("solver", ["symmetric", "heuristic"])
def test_of_sets_that_tie_in_t_the_one_that_rents_less_wins(tmp_path, solver):
    """A budget that rents either twin but not both: each is a maximal set, of equal T. (The frontier
    and objective cost solve such budgets at their levels: eight.yaml's frontier listed 1×RTX4090 at
    the dearer twin's $0.36/h.)"""
    (tmp_path / "p.yaml").write_text(TWINS + "budget_per_hour: 0.4\n")
    result = CliRunner().invoke(app, ["solve", str(tmp_path / "p.yaml"), "-s", solver, "--kind", "layered",
                                      "-t", "4", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["rent_per_hour"] == pytest.approx(0.34)  # the $0.36 twin had won: it is the first set listed


def test_a_budget_no_set_meets_names_the_registered_solver(tmp_path):
    (tmp_path / "p.yaml").write_text(TWINS.replace("model: tiny", "model: llama2-7b") + "budget_per_hour: 0.5\n")
    result = CliRunner().invoke(app, ["solve", str(tmp_path / "p.yaml"), "--kind", "layered", "-t", "3", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["solver"] == "heuristic"  # not the function's name, solve_heuristic


def _two_kinds(problem) -> dict:
    """A fast layered plan on the H100s (T 1 s) and a slower sequence plan on one A100 (T 2 s):
    the faster plan costs more per token."""
    layered = Plan.model_validate({"problem": problem.name, "pipelines": [
        {"batch": 2, "stages": [{"devices": [0, 1], "layers": 4}]}]})
    sequence = SeqPlan.model_validate({"problem": problem.name, "replicas": [
        {"batch": 2, "ring": [{"members": [{"device": 2, "heads": 4, "tokens": 1024}]}]}]})
    return {"layered": (layered, 1.0), "sequence": (sequence, 2.0)}


@pytest.mark.parametrize("objective", ["time", "cost"])
def test_kind_auto_chooses_argues_and_reports_by_the_objective(monkeypatch, objective):
    problem = load_problem_text(LONG + f"objective: {objective}\n")
    plans = _two_kinds(problem)

    def solve_in_kind(problem, solver, options, kind):
        plan, t = plans[kind]
        return SolveResult(solver=solver, status=SolveStatus.feasible, plan=plan, objective_s=t, wall_s=0.0)

    monkeypatch.setattr(choose, "solve_in_kind", solve_in_kind)
    result = choose.solve(problem, "heuristic", SolverOptions(time_limit_s=5))
    if objective == "cost":
        costs = {kind: cost_per_mtok(problem, plan, t) for kind, (plan, t) in plans.items()}
        assert result.plan is plans["sequence"][0] or result.plan == plans["sequence"][0]
        assert result.kinds_tried == pytest.approx(costs, rel=1e-12)
        ratio = costs["layered"] / costs["sequence"]
        assert ratio > 1 and f"sequence is {ratio:.3g}× cheaper per token" in result.kind_reason
        assert "faster" not in result.kind_reason  # the sequence plan is the slower one
    else:
        assert result.plan == plans["layered"][0] and result.kinds_tried == {"layered": 1.0, "sequence": 2.0}
        assert "layered is 2× faster" in result.kind_reason


def load_problem_text(text: str):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.yaml"
        path.write_text(text)
        return load_problem(path)


def test_under_objective_cost_idle_machines_are_argued_in_cost(tmp_path):
    (tmp_path / "p.yaml").write_text(LONG + "objective: cost\n")
    result = CliRunner().invoke(app, ["solve", str(tmp_path / "p.yaml"), "--kind", "layered", "-t", "3"])
    assert result.exit_code == 0, result.output
    idle = " ".join(result.stdout.split("why the others are idle")[1].split("iteration time")[0].split())
    assert "h100-0 (2 idle)" in idle and "per million tokens vs" in idle, idle


def _rows(problem, kinds=("layered", "layered", "sequence", "sequence")):
    """Four rows as compare printed them for p16cost: the solvers' names tell the rows apart."""
    figures = [("heuristic", 8.86, 0.1021), ("symmetric", 8.86, 0.1021), ("seq-uniform", 6.749, 0.159),
               ("heuristic", 6.749, 0.159)]
    return [ComparisonRow(problem=problem.name, solver=name, kind=kind, status="feasible", iteration_s=t, mfu=0.1,
                          speedup=1.0, wall_s=1.6, devices_used=8, rent_per_hour=2.72, cost_per_mtok=cost,
                          message="the cheapest per token of 5 frontier point(s)")
            for (name, t, cost), kind in zip(figures, kinds)]


def test_compare_shows_every_solver_name_whole_at_80_columns():
    problem = load_problem_text(LONG)
    console = Console(width=80, record=True)
    console.print(comparison_table(problem, _rows(problem)))
    lines = [line for line in console.export_text().splitlines() if "feasible" in line]
    assert [line.split()[:2] for line in lines] == [["heuristic", "layered"], ["symmetric", "layered"],
                                                    ["seq-uniform", "sequence"], ["heuristic", "sequence"]]
    assert all(line.rstrip().endswith(("0.1021", "0.159")) for line in lines)  # and the cost column is there


@pytest.mark.parametrize("objective,bold_column", [("time", "T (s)"), ("cost", "$/Mtok")])
def test_compare_marks_the_best_row_by_the_objective(objective, bold_column):
    problem = load_problem_text(LONG + f"objective: {objective}\n")
    table = comparison_table(problem, _rows(problem))
    marked = {(column.header, i) for column in table.columns for i, cell in enumerate(column._cells)
              if "[bold green]" in str(cell)}
    best_row = 0 if objective == "cost" else 2  # the cheapest per token is the first row; the fastest the third
    assert marked == {(bold_column, best_row)}


def test_a_short_build_time_is_not_said_to_be_0_s():
    assert _seconds(0.3) == "0.3 s" and _seconds(42.4) == "42 s"
