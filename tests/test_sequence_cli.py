"""The CLI on sequence plans (docs/sequence-plans.md §7): `solve --kind auto` picks the kind by the
documented rule, `compare` on a long-context problem has rows of both kinds, `show` draws a
sequence plan's ring and per-device bars, and the ring picture's token shares add up to s."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from hexiscale.cli.compare import compare_problem, parse_solvers, solvers_for, with_cross_kind
from solvers.choose import choose_kind
from solvers.sequence import LONG_CONTEXT_TOKENS
from hexiscale.viz.sequence_bars import TIME_PARTS, member_memory, member_times
from hexiscale.viz.sequence_ring import ring_figure, ring_shares
from planner.io import load_plan, load_problem
from planner.kinds import evaluate
from solvers.common import SolverOptions

matplotlib.use("Agg")
LONG = "longctx-h100-a100-llama3-8b-64k"
QUICK = ["-t", "20"]  # both kinds' heuristics on LONG in 8 s instead of 10 at the default 60 s; the same kinds win


def test_choose_kind_rule():
    long, short = load_problem(LONG), load_problem("demo-tiny")
    assert long.training.seq_len >= LONG_CONTEXT_TOKENS > short.training.seq_len
    assert choose_kind(long)[0] == "sequence" and choose_kind(short)[0] == "layered"
    assert choose_kind(long, "layered") == ("layered", "")  # an explicit kind always wins
    assert choose_kind(long, "auto", "symmetric")[0] == "layered"  # only layered plans have symmetric
    assert choose_kind(short, "auto", "seq-uniform")[0] == "sequence"


def test_solve_auto_picks_sequence_on_a_long_context_problem(no_move_work):
    result = CliRunner().invoke(app, ["solve", LONG, "--json", *QUICK])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kind"] == "sequence" and "sequence is" in data["kind_reason"] and "faster" in data["kind_reason"]
    assert data["plan"]["format"] == "hexiscale.seqplan/1"
    table = CliRunner().invoke(app, ["solve", LONG, "-s", "seq-uniform", *QUICK])
    assert table.exit_code == 0 and "plan kind: sequence" in table.stderr


def test_solve_auto_picks_layered_on_demo_tiny():
    result = CliRunner().invoke(app, ["solve", "demo-tiny", "-t", "10"])
    assert result.exit_code == 0, result.output
    assert "plan kind: layered" in result.stderr and "pipelines" in result.stdout


def test_solve_rejects_a_solver_of_the_other_kind():
    result = CliRunner().invoke(app, ["solve", LONG, "--kind", "sequence", "-s", "symmetric"])
    assert result.exit_code == 2 and "symmetric" in result.output


def test_compare_has_rows_of_both_kinds_on_a_long_context_problem(no_move_work):
    problem = load_problem(LONG)
    kind, solvers, why = solvers_for(problem, "auto", parse_solvers(None))
    assert kind == "sequence" and solvers == ["heuristic", "seq-uniform", "seq-roundrobin", "layered:heuristic"]
    rows = compare_problem(problem, solvers, SolverOptions(time_limit_s=20), kind=kind)
    assert [(r.kind, r.solver) for r in rows] == [("sequence", "heuristic"), ("sequence", "seq-uniform"),
                                                 ("sequence", "seq-roundrobin"), ("layered", "heuristic")]
    uniform = rows[1].iteration_s
    for r in rows:
        assert r.iteration_s is not None and r.speedup == pytest.approx(uniform / r.iteration_s)
    assert rows[0].iteration_s < rows[3].iteration_s  # at 64K the sequence plan wins
    assert with_cross_kind(["heuristic", "layered:symmetric"], "sequence") == ["heuristic", "layered:symmetric"]


def test_compare_cli_labels_the_kinds(no_move_work):
    result = CliRunner().invoke(app, ["compare", LONG, "-s", "seq-uniform,layered:symmetric", "--json", *QUICK])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["kind"], r["solver"]) for r in rows] == [("sequence", "seq-uniform"), ("layered", "symmetric")]
    table = CliRunner().invoke(app, ["compare", LONG, "--kind", "sequence", "-s", "seq-uniform,seq-roundrobin", *QUICK])
    assert table.exit_code == 0, table.output
    assert "layered" in table.stdout and "×unif" in table.stdout  # the layered heuristic's row
    wrong = CliRunner().invoke(app, ["compare", LONG, "--kind", "sequence", "-s", "symmetric"])
    assert wrong.exit_code == 2 and "symmetric" in wrong.output


def test_show_writes_pngs_for_a_bundled_seqplan(tmp_path):
    result = CliRunner().invoke(app, ["show", "longctx-tiny", "longctx-tiny", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("ring.png", "devices.png"):
        path = tmp_path / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 500 and pixels[..., :3].std() > 0.05


def test_ring_token_shares_sum_to_s_and_heads_to_a():
    problem, plan = load_problem("longctx-tiny"), load_plan("longctx-tiny")
    s, a = problem.training.seq_len, problem.model.heads
    shares = ring_shares(problem, plan)
    for groups in shares:
        assert sum(g["tokens"] for g in groups) == s
        for g in groups:
            assert sum(m[2] for m in g["members"]) == a and sum(m[3] for m in g["members"]) == g["tokens"]
    fig = ring_figure(problem, plan)
    donuts = [ax for ax in fig.axes if any(p.get_gid() == "group" for p in ax.patches)]
    assert len(donuts) == len(plan.replicas)
    for ax, groups in zip(donuts, shares):
        wedges = [p for p in ax.patches if p.get_gid() == "group"]
        spans = [abs(w.theta2 - w.theta1) for w in wedges]
        assert sum(spans) == pytest.approx(360)
        assert np.allclose(np.array(spans) / 360 * s, [g["tokens"] for g in groups])
    matplotlib.pyplot.close(fig)


def test_device_time_bars_add_up_to_t_and_memory_to_the_evaluator():
    problem, plan = load_problem("longctx-tiny"), load_plan("longctx-tiny")
    est = evaluate(problem, plan)
    times, mem = member_times(problem, est), member_memory(problem, est)
    total = sum(times[k] for k, _ in TIME_PARTS)
    assert np.allclose(total, est.iteration_s, rtol=1e-9)
    assert np.allclose(mem["total"], [m.memory_gib for m in est.members])
    assert (mem["reserve"] >= -1e-9).all()


@pytest.mark.parametrize("command", ["solve", "frontier"])
def test_the_solver_option_lists_every_kinds_solvers(command):
    """`--help` named the layered solvers only, though `-s bound` and `-s seq-uniform` work."""
    from solvers.registry import SOLVERS_BY_KIND

    out = " ".join(CliRunner().invoke(app, [command, "--help"], terminal_width=400).output.split())
    for names in SOLVERS_BY_KIND.values():
        for name in names:
            assert name in out
