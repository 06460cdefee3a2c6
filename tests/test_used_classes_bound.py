"""[U9], [U10] (docs/bounds.md §6): the split on the machines every pipeline uses. Where the
stage that sets a pipeline's b is on a machine some pipeline lacks, its layers' rings leave that
machine and the crossing table prices that stage's sync; where it is on a machine all use, it
takes its width there beside one device of every other pipeline. Checked against every plan
brute force enumerates on tiny problems, priced by the evaluator: the split never refutes the
fastest plan of a D; it refutes more than the plain test somewhere; and the crossing floor taken
without the condition refutes plans that exist (so these problems can see the condition)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from instances.random_small import random_small
from planner.layered.pricing import breakdown, iteration_time
from planner.layered.validate import validate
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
            t = breakdown(problem, brute.plan_table(problem, pipes)).iteration  # iteration_time, without a Plan
            fastest[len(pipes)] = min(fastest.get(len(pipes), np.inf), t)
    return fastest


def _cases():
    """(table of D with its crossing part, D, B/b, fastest T of D, machines of ≥ D devices per
    class) over the tiny problems."""
    for seed in range(SEEDS):
        problem = random_small(seed, tiny=True)
        tables = Tables(problem)
        by_d = {d: class_types(tables, d) for d in range(1, tables.max_pipelines + 1)}
        own = usage_tables(by_d, breakpoints(by_d[1], 3 * tables.trivial_bound))
        counts = np.array([m.count for m in problem.cluster.machines])
        for d, t in _fastest_per_d(problem).items():
            if own[d].crossing is not None:
                holding = np.bincount(by_d[d].class_of_machine, weights=counts >= d, minlength=len(own[d].dims))
                yield own[d], d, tables.total_micro, t, holding.astype(int)


@pytest.fixture(scope="module")
def cases():
    return list(_cases())


def _plain_refutes(table, d: int, micro: int, v: float) -> bool:
    return integer._refutes(integer.capacities(table, v, micro - d + 1), table, d, micro, None)


def test_the_split_never_refutes_the_fastest_plan_of_a_d_and_refutes_more_than_the_plain_test(cases) -> None:
    assert len(cases) >= 50, len(cases)
    lifted = 0
    for table, d, micro, t, _ in cases:
        assert not integer.refuted(table, d, micro, t * (1 + 1e-9)), (d, t)
        below = [t * f for f in (0.999, 0.99, 0.97, 0.9)]
        lifted += any(integer.refuted(table, d, micro, v) and not _plain_refutes(table, d, micro, v) for v in below)
    assert lifted >= 2, lifted


def test_the_crossing_floor_without_the_condition_on_z_refutes_plans_that_exist(cases, monkeypatch) -> None:
    """Every breakpoint priced by the crossing table, whatever the classes used: not a bound."""
    none = lambda table: integer.Shared((0,) * len(table.dims), (0,) * len(table.dims))  # noqa: E731
    monkeypatch.setattr(integer, "class_sets", lambda table, d: None if table.crossing is None else [none(table)])
    wrong = sum(integer.refuted(table, d, micro, t * (1 + 1e-9)) for table, d, micro, t, _ in cases)
    assert wrong >= 5, wrong


def test_only_machines_of_at_least_d_devices_are_shared_by_every_pipeline(cases) -> None:
    """A class counts at most its machines of ≥ D devices as used by all D pipelines, and every
    count from 0 to that is a case."""
    for table, d, _, _, holding in cases:
        sets = integer.class_sets(table, d)
        assert all(all(c <= h for c, h in zip(z.count, holding)) for z in sets)
        assert len(sets) == np.prod(holding + 1), (sets, holding)


def test_crossing_parts_are_left_out_rather_than_coarser_classes_taken(monkeypatch) -> None:
    """Where the memory holds the tables the route needs but not their crossing parts too, the
    route keeps its classes of like machines and builds no crossing part."""
    from solvers.layered.bound import route
    from solvers.layered.bound.usage import usage_size

    tables = Tables(random_small(1, tiny=True))  # three machines of one GPU, unlike in size or links
    ds, own = list(range(1, tables.max_pipelines + 1)), {1, 2}
    by_d, b, built, crossing, _ = route._route_classes(tables, ds, 3 * tables.trivial_bound, 60.0, own)
    assert crossing and built == set(ds)  # every D's own table, with its crossing part, fits
    groups = len({t.caps.tobytes() for t in by_d.values()}) + len(own) + route.PENDING_TABLES
    monkeypatch.setattr(route, "MAX_TABLE_BYTES", 4.0 * len(b) * usage_size(by_d[1]) * (groups + 0.5))
    tighter, _, built, crossing, _ = route._route_classes(tables, ds, 3 * tables.trivial_bound, 60.0, own)
    assert not crossing and built == own
    assert tighter[1].class_of_machine.tolist() == by_d[1].class_of_machine.tolist() == [0, 1, 2]


def test_room_on_the_shared_machines_is_the_spare_devices_of_the_largest_machines_of_at_least_d() -> None:
    """Machines of 8, 8 and 4 devices in class 0, one of 4 in class 1, D = 5: class 0 may share
    one machine (3 spare) or both of its 8s (6); class 1 none."""
    from solvers.layered.bound.classes import _room

    room = _room(np.array([8, 4, 8, 4]), np.array([0, 0, 0, 1]), pipelines=5)
    assert room.tolist() == [[0, 3, 6, -1], [0, -1, -1, -1]]


def test_too_many_cases_keep_every_count_below_the_cut_and_at_least_the_cut_on_all_machines() -> None:
    """Four classes of three machines of ≥ D devices each (4⁴ = 256 cases > MAX_CLASS_SETS): the
    counts are cut at 1, and count 1 then stands for 'at least one', with the room of all three."""
    from solvers.layered.bound.usage import UsageTable

    room = np.tile([0, 4, 8, 12], (4, 1))
    table = UsageTable(b=np.zeros(1), least=np.zeros((1, 1)), dims=(13,) * 4, crossing=np.zeros((1, 1)), room=room)
    sets = integer.class_sets(table, 4)
    assert len(sets) == 16 <= integer.MAX_CLASS_SETS
    assert {z.count for z in sets} == set(itertools.product((0, 1), repeat=4))
    assert all(r == (12 if c else 0) for z in sets for c, r in zip(z.count, z.room))


def _random_plans(problem, rng: np.random.Generator, tries: int):
    """Valid plans of D ≥ 2 drawn at random (stages of width 1–8 on machines with room, few
    stages per pipeline, so that wide single-stage pipelines share machines often): (pipes, T)."""
    counts = [m.count for m in problem.cluster.machines]
    total, layers = problem.training.micro_batches, problem.model.layers
    for _ in range(tries):
        d = int(rng.integers(2, min(total, 4) + 1))
        free, pipes = list(counts), []
        for _ in range(d):
            seq = []
            for _ in range(int(rng.integers(1, min(3, layers) + 1))):
                machines = [k for k, f in enumerate(free) if f]
                if not machines:
                    break
                k = int(rng.choice(machines))
                t = int(rng.choice([w for w in (1, 2, 4, 8) if w <= free[k]]))
                free[k] -= t
                seq.append((k, t))
            if not seq:
                break
            cuts = np.sort(rng.choice(np.arange(1, layers), size=len(seq) - 1, replace=False))
            pipes.append((tuple(seq), tuple(np.diff(np.concatenate([[0], cuts, [layers]])).astype(int).tolist()), 0))
        if len(pipes) < d:
            continue
        split = np.diff(np.concatenate([[0], np.sort(rng.choice(np.arange(1, total), size=d - 1, replace=False)), [total]]))
        pipes = [(seq, lay, int(m)) for (seq, lay, _), m in zip(pipes, split)]
        plan = brute.make_plan(problem, pipes)
        if not validate(problem, plan):
            yield pipes, iteration_time(problem, plan)


def test_the_split_never_refutes_a_random_plan_on_machines_of_up_to_eight() -> None:
    """Machines of up to 8 devices, where two wide pipelines can share a machine and the room
    rows of [U10] come into play: no valid plan drawn at random is refuted at its own T."""
    checked = 0
    for seed in range(16):
        problem = random_small(1000 + seed, max_devices=20)
        problem = problem.model_copy(update={"training": problem.training.model_copy(
            update={"global_batch": problem.training.micro_batch * 8})})
        tables = Tables(problem)
        plans = list(_random_plans(problem, np.random.default_rng(seed), 400))
        if not plans:
            continue  # memory too tight for stages drawn at random
        by_d = {d: class_types(tables, d) for d in {len(p) for p, _ in plans}}
        own = usage_tables(by_d, breakpoints(by_d[min(by_d)], 1.01 * max(t for _, t in plans)))
        for pipes, t in plans:
            assert not integer.refuted(own[len(pipes)], len(pipes), tables.total_micro, t * (1 + 1e-9)), pipes
        checked += len(plans)
    assert checked >= 500, checked
