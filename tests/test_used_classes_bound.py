"""[U9] (docs/bounds.md §6): the split on the set Z of classes every pipeline uses. Where the
stage that sets a pipeline's b is in a class some pipeline lacks, its layers' rings leave its
machine and the crossing table prices that stage's sync. Checked against every plan brute force
enumerates on tiny problems, priced by the evaluator: the split never refutes the fastest plan
of a D; it refutes more than the plain test somewhere; and the crossing floor taken without the
condition on Z refutes plans that exist (so these problems can see the condition)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from instances.random_small import random_small
from planner.layered.pricing import iteration_time
from solvers.layered.bound import integer
from solvers.layered.bound.classes import class_types
from solvers.layered.bound.pricing import breakpoints
from solvers.layered.bound.usage import usage_tables
from solvers.layered.exact import brute
from solvers.layered.tables import Tables

SEEDS = 80
PLANS_PER_PROBLEM = 3000


def _fastest_per_d(problem) -> dict[int, float]:
    """Per D ≥ 2, the least T of the enumerated plans."""
    fastest: dict[int, float] = {}
    for pipes in itertools.islice(brute.enumerate_plans(problem), PLANS_PER_PROBLEM):
        if len(pipes) >= 2:
            t = iteration_time(problem, brute.make_plan(problem, pipes))
            fastest[len(pipes)] = min(fastest.get(len(pipes), np.inf), t)
    return fastest


def _cases():
    """(table of D with its crossing part, D, B/b, fastest T of D) over the tiny problems."""
    for seed in range(SEEDS):
        problem = random_small(seed, tiny=True)
        tables = Tables(problem)
        by_d = {d: class_types(tables, d) for d in range(1, tables.max_pipelines + 1)}
        own = usage_tables(by_d, breakpoints(by_d[1], 3 * tables.trivial_bound))
        for d, t in _fastest_per_d(problem).items():
            if own[d].crossing is not None:
                yield own[d], d, tables.total_micro, t


@pytest.fixture(scope="module")
def cases():
    return list(_cases())


def _plain_refutes(table, d: int, micro: int, v: float) -> bool:
    return integer._refutes(integer.capacities(table, v, micro - d + 1), table, d, micro, None)


def test_the_split_never_refutes_the_fastest_plan_of_a_d_and_refutes_more_than_the_plain_test(cases) -> None:
    assert len(cases) >= 50, len(cases)
    lifted = 0
    for table, d, micro, t in cases:
        assert not integer.refuted(table, d, micro, t * (1 + 1e-9)), (d, t)
        below = [t * f for f in (0.999, 0.99, 0.97, 0.9)]
        lifted += any(integer.refuted(table, d, micro, v) and not _plain_refutes(table, d, micro, v) for v in below)
    assert lifted >= 2, lifted


def test_the_crossing_floor_without_the_condition_on_z_refutes_plans_that_exist(cases, monkeypatch) -> None:
    """Every breakpoint priced by the crossing table, whatever the classes used: not a bound."""
    everywhere = integer.used_class_capacities
    monkeypatch.setattr(integer, "used_class_capacities", lambda table, used, v, most: everywhere(table, (), v, most))
    monkeypatch.setattr(integer, "class_sets", lambda table, d: None if table.crossing is None else [()])
    wrong = sum(integer.refuted(table, d, micro, t * (1 + 1e-9)) for table, d, micro, t in cases)
    assert wrong >= 5, wrong


def test_a_set_of_classes_with_fewer_devices_than_pipelines_is_not_tested(cases) -> None:
    """Z only holds classes each of the D pipelines can have a device of."""
    for table, d, _, _ in cases:
        for z in integer.class_sets(table, d) or []:
            assert all(table.dims[k] - 1 >= d for k in z)


def test_crossing_parts_are_left_out_rather_than_coarser_classes_taken(monkeypatch) -> None:
    """Where the memory holds the tables the route needs but not their crossing parts too, the
    route keeps its classes of like machines and builds no crossing part."""
    from solvers.layered.bound import search
    from solvers.layered.bound.usage import usage_size

    tables = Tables(random_small(1, tiny=True))  # three machines of one GPU, unlike in size or links
    ds, own = list(range(1, tables.max_pipelines + 1)), {1, 2}
    by_d, b, crossing = search._route_classes(tables, ds, 3 * tables.trivial_bound, 60.0, own)
    assert crossing
    groups = len({t.caps.tobytes() for t in by_d.values()}) + len(own) + search.PENDING_TABLES
    monkeypatch.setattr(search, "MAX_TABLE_BYTES", 4.0 * len(b) * usage_size(by_d[1]) * (groups + 0.5))
    tighter, _, crossing = search._route_classes(tables, ds, 3 * tables.trivial_bound, 60.0, own)
    assert not crossing
    assert tighter[1].class_of_machine.tolist() == by_d[1].class_of_machine.tolist() == [0, 1, 2]
