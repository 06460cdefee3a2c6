"""The exact models as built objects: `build_model` returns the model and its variables in
frozen groups, and every variable of a built model has its own name (CP-SAT and MILP), with
and without the optional cuts, hints and fixed structures."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest

from exact_problems import random_problem
from solvers.common import SolverOptions
from solvers.layered.exact import brute, cpsat, milp
from solvers.layered.exact.bounds import DBounds, ordered_structures, structures
from solvers.layered.exact.subproblem import SubProblem
from solvers.layered.tables import Tables, specs_of_plan

SEEDS = (2, 5, 8, 11, 14)


def _subproblems(seed: int):
    """One sub-problem per D: plain, then with the incumbent's cutoff, hint, floors and the
    first fixed structure (with its stage order) when there is one."""
    problem = random_problem(seed, max_devices=5, max_layers=5, max_micro=4)
    truth = brute.solve(problem)
    tables = Tables(problem)
    bounds = DBounds(tables)
    hint = specs_of_plan(problem, truth.plan) if truth.plan is not None else None
    cutoff = truth.objective_s * 1.5 if truth.plan is not None else None
    for d in range(1, tables.max_pipelines + 1):
        base = dict(tables=tables, pipelines=d, options=SolverOptions(), time_limit=1.0, cutoff=None,
                    hint=None, max_stages=min(tables.max_stages, tables.num_devices - d + 1))
        yield SubProblem(**base)
        if cutoff is None:
            continue
        floors = bounds.floors_for(d)
        combos = structures(floors, d, cutoff, 24) or [None]
        ordered = ordered_structures(floors, [c for c in combos if c], cutoff, 24) or [None]
        yield SubProblem(**{**base, "cutoff": cutoff, "hint": hint if hint and len(hint) == d else None},
                         lower_bound=tables.trivial_bound, floors=floors, structure=ordered[0] or combos[0])


def _duplicates(names) -> list[str]:
    return [name for name, count in Counter(names).items() if count > 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_every_cpsat_variable_has_its_own_name(seed):
    for sub in _subproblems(seed):
        model, v = cpsat.build_model(sub, cpsat.time_scale(sub))
        if sub.hint:
            cpsat.add_hint(model, v, sub.hint, sub.tables.types)
        names = [var.name for var in model.proto.variables if var.name]
        assert names and not _duplicates(names), _duplicates(names)
        assert not model.validate()


@pytest.mark.parametrize("seed", SEEDS)
def test_every_milp_variable_has_its_own_name(seed):
    for sub in _subproblems(seed):
        lp, _ = milp.build_model(sub)
        names = [var.name for var in lp.variables()]
        assert names and not _duplicates(names), _duplicates(names)


def test_models_return_their_variables_in_frozen_groups():
    sub = next(s for s in _subproblems(SEEDS[0]) if s.pipelines == 2)
    for model, v in (cpsat.build_model(sub, cpsat.time_scale(sub)), milp.build_model(sub)):
        groups = [getattr(v, f.name) for f in dataclasses.fields(v)]
        assert dataclasses.is_dataclass(v) and any(dataclasses.is_dataclass(g) for g in groups)
        with pytest.raises(dataclasses.FrozenInstanceError):
            v.T = None
        assert len(v.layout.z) == sub.pipelines * sub.tables.layers * len(sub.tables.types)


@pytest.mark.parametrize("backend", [cpsat, milp], ids=["cpsat", "milp"])
def test_a_build_past_its_deadline_stops_and_leaves_its_d_open(backend, monkeypatch):
    """A model's build stops at its share of the time (BuildStopped from the loop over the
    pipelines), and the driver leaves that D open instead of building on: on the 96-GPU offers
    problem one D's build took 12 s of a 0.1 s share (`solve -s cpsat -t 5`: 16 s; milp 56–93 s)."""
    import time

    from solvers.layered.exact import driver
    from solvers.layered.exact.subproblem import BuildStopped

    sub = next(_subproblems(2))
    with pytest.raises(BuildStopped):
        backend.solve_fixed_d(dataclasses.replace(sub, build_deadline=time.perf_counter() - 1.0))
    problem = random_problem(2, max_devices=5, max_layers=5, max_micro=4)
    real = SubProblem.__init__
    monkeypatch.setattr(SubProblem, "__init__", lambda self, **kw: real(self, **{**kw, "build_deadline": 0.0}))
    lines = []
    monkeypatch.setattr(driver, "_logger", lambda options: lines.append)
    result = backend.solve(problem, SolverOptions(time_limit_s=2, progress=False))
    # every build stopped: no model proves a D, the log says which, and the passes end
    assert result.status.value != "optimal", result.message
    assert any(re.match(r"D in [-\d,]+: open, building the model stopped at its share of the time", line)
               for line in lines), lines
