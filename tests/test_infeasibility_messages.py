"""Infeasibility reads the same whichever solver finds it, and a heuristic that finds nothing
says `unknown` unless it holds a proof (failing to find a plan proves nothing)."""

from __future__ import annotations

import pytest

from planner import Problem
from planner.io import load_cluster, load_model, load_problem
from planner.solver_info import SolveStatus
from planner.workload import TrainingSpec
from solvers.common import SolverOptions
from solvers.layered.heuristic import search
from solvers.registry import solve


def too_big() -> Problem:
    """Llama-2 7B's states (100.4 GiB) on two GPUs with 100 GiB past the reserve."""
    return Problem(name="too-big", cluster=load_cluster("tiny-2"), model=load_model("llama2-7b"),
                   training=TrainingSpec(seq_len=1024, global_batch=4))


def test_heuristic_and_exact_solvers_explain_infeasibility_alike():
    messages = {}
    for name in ("heuristic", "milp", "cpsat"):
        result = solve(too_big(), name, SolverOptions(time_limit_s=20))
        assert result.status == SolveStatus.infeasible and result.plan is None
        messages[name] = result.message
    assert len(set(messages.values())) == 1 and "model states need 100.4 GiB" in messages["heuristic"]


def test_a_heuristic_that_finds_nothing_on_a_feasible_problem_says_unknown(monkeypatch):
    problem = load_problem("tiny-4-llama2-7b")
    assert solve(problem, "cpsat", SolverOptions(time_limit_s=30)).status == SolveStatus.optimal
    monkeypatch.setattr(search.Search, "own_best", lambda self: None)  # the search comes back empty
    result = search.solve(problem, SolverOptions())  # its own search (the registry's adds CP-SAT)
    assert result.status == SolveStatus.unknown and result.plan is None
    assert "no proof" in result.message


@pytest.mark.parametrize("name,tp,reason", [("tiny-4-tiny-mha", 8, "does not divide heads"),
                                            ("tiny-4-llama2-7b", 8, "no machine has 8 devices")])
def test_a_fixed_tp_size_that_cannot_exist_is_proved_infeasible(name, tp, reason):
    result = search.solve_with(load_problem(name), SolverOptions(), search.HeuristicOptions(fixed_tp=tp))
    assert result.status == SolveStatus.infeasible and reason in result.message
