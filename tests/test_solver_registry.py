"""The registry reaches every solver of every plan kind, and each returns plans of its kind."""

from __future__ import annotations

import pytest

from planner.io import load_problem
from planner.kinds import PLAN_KINDS, kind_of
from solvers.common import SolverOptions
from solvers.registry import SOLVERS_BY_KIND, available, get, solve


def test_every_kind_with_solvers_is_a_plan_kind():
    assert set(SOLVERS_BY_KIND) <= set(PLAN_KINDS)


@pytest.mark.parametrize("kind,name", [(k, n) for k, names in SOLVERS_BY_KIND.items() for n in names])
def test_every_entry_resolves_to_a_function(kind, name):
    assert callable(get(name, kind))


@pytest.mark.parametrize("name", ["heuristic", "symmetric", "brute"])
def test_a_solver_returns_a_plan_of_its_kind(name):
    result = solve(load_problem("tiny-2-tiny"), name, SolverOptions(time_limit_s=10), kind="layered")
    assert kind_of(result.plan).name == "layered"


def test_unknown_kind_and_solver_name_the_alternatives():
    with pytest.raises(KeyError, match="kinds with solvers: layered"):
        available("nope")
    with pytest.raises(KeyError, match="available: heuristic"):
        get("nope")
