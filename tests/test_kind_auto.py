"""`--kind auto` chooses by cost: on the bundled long-context testbed (llama3-8b on the H100 +
A100 cluster, 2^20 tokens per iteration) it keeps the faster kind at 8K…64K tokens, checked
against solving each kind explicitly with the same solver — in the API and in the CLI."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import save_yaml, problem_to_dict
from planner.kinds import evaluate, kind_of
from solvers.choose import solve as solve_auto
from solvers.common import SolverOptions
from solvers.registry import solve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_seqlen import seqlen_problem  # noqa: E402

OPTIONS = SolverOptions(time_limit_s=30, progress=False)

# (`no_move_work`, tests/conftest.py: the choice of kind is under test, not the plan's quality,
# and with the moves' work fixed the explicit and the automatic solves do the same search)


def _explicit(problem, kind: str) -> float | None:
    result = solve(problem, "heuristic", OPTIONS, kind=kind)
    return None if result.plan is None else evaluate(problem, result.plan).iteration_s


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [8192, 32768])  # the near tie, and a clear case (16K: the CLI test below)
def test_auto_keeps_the_faster_kind(seq_len, no_move_work):
    problem = seqlen_problem(seq_len)
    times = {kind: _explicit(problem, kind) for kind in ("layered", "sequence")}
    faster = min((k for k in times if times[k] is not None), key=times.get)
    result = solve_auto(problem, "heuristic", OPTIONS)
    assert kind_of(result.plan).name == faster, (times, result.kind_reason)
    assert result.objective_s == pytest.approx(times[faster], rel=1e-9)
    assert result.kinds_tried == pytest.approx(times, rel=1e-9)
    assert faster in result.kind_reason and "faster" in result.kind_reason


def test_the_cli_says_which_kind_and_why(tmp_path, no_move_work):
    problem = seqlen_problem(16384)
    path = tmp_path / "p.yaml"
    save_yaml(problem_to_dict(problem), path)
    out = CliRunner().invoke(app, ["solve", str(path), "--json", "-t", "30"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert set(data["kinds_tried"]) == {"layered", "sequence"}
    best = min(data["kinds_tried"], key=data["kinds_tried"].get)
    assert data["kind"] == best and best in data["kind_reason"]


def test_an_explicit_kind_solves_that_kind_only(no_move_work):
    result = solve_auto(seqlen_problem(65536), "heuristic", OPTIONS, kind="layered")
    assert kind_of(result.plan).name == "layered" and result.kinds_tried == {} and result.kind_reason == ""


def test_the_preferred_kind_is_solved_last_with_the_time_the_others_leave(monkeypatch):
    """Short context prefers layered plans: the sequence kind is solved first within half of the
    limit, and the layered search gets the rest — all of it less what the sequence kind took."""
    import solvers.choose as choose

    budgets, took, real = [], [], choose.solve_in_kind

    def recording(problem, solver, options, *, kind):
        budgets.append((kind, options.time_limit_s))
        start = time.perf_counter()
        result = real(problem, solver, options.model_copy(update={"time_limit_s": 2}), kind=kind)
        took.append(time.perf_counter() - start)
        return result

    monkeypatch.setattr(choose, "solve_in_kind", recording)
    problem = seqlen_problem(4096)
    assert choose.choose_kind(problem)[0] == "layered"
    result = solve_auto(problem, "heuristic", SolverOptions(time_limit_s=100, progress=False))
    (first, first_s), (last, last_s) = budgets
    assert (first, last) == ("sequence", "layered")
    assert first_s == pytest.approx(100 * choose.OTHERS_SHARE, abs=0.5)
    assert last_s == pytest.approx(100 - took[0], abs=0.5)  # not 50: what the sequence kind left
    assert list(result.kinds_tried) == ["layered", "sequence"]  # reported preferred kind first


@pytest.mark.parametrize("seq_len", [2000, 4160])  # not multiples of 2q = 128: no ring can split them
def test_a_sequence_no_ring_splits_leaves_the_layered_plan(seq_len):
    """Every sequence solver answers infeasible with rule 3's reason (the heuristic had built a
    plan breaking it, and `solve`'s default kind failed with exit 2); auto keeps the layered plan."""
    problem = seqlen_problem(8192)
    problem = problem.model_copy(update={"training": problem.training.model_copy(update={"seq_len": seq_len})})
    for solver in ("heuristic", "seq-uniform", "bound"):
        result = solve(problem, solver, SolverOptions(time_limit_s=2, progress=False), kind="sequence")
        assert result.plan is None and result.status == "infeasible", solver
        assert f"seq_len {seq_len} is not a multiple of 2·token_block = 128" in result.message
    result = solve_auto(problem, "heuristic", SolverOptions(time_limit_s=4, progress=False))
    assert kind_of(result.plan).name == "layered" and result.kinds_tried["sequence"] is None
