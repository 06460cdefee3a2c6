"""[U12] (docs/bounds.md §6): below a level of T_dp the layers are aligned across the pipelines
(each local layer on the same class in every pipeline, few crossing layers). Checked against
every plan brute force enumerates on small problems, priced by the evaluator: for every interval
of T_dp, the test never refutes the fastest plan whose T_dp lies in it, nor does [U11]'s split
with it the fastest plan of a D; with the crossing layers left out (as if every layer were local)
it refutes plans that exist, so these problems can see the allowance. On them it never refutes
more than [U11] already does (their classes are few and their gaps elsewhere); on hetero-1 7B,
where crossing a 10 GbE link costs 0.06–0.49 s per layer, it does."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from instances.generate import generate_cluster, generated_problem
from instances.random_small import random_small
from planner.io import load_problem
from planner.layered.evaluate import evaluate
from planner.layered.pricing import breakdown
from solvers.common import SolverOptions
from solvers.layered.heuristic import HeuristicOptions, solve_with
from solvers.layered.bound import aligned, integer, route, sync_level
from solvers.layered.bound.aligned import AlignedTest
from solvers.layered.bound.classes import class_types
from solvers.layered.bound.pricing import breakpoints
from solvers.layered.bound.sync_level import LEVEL_SHARES, SyncLevelSplit
from solvers.layered.bound.usage import route_tables, usage_tables
from solvers.layered.exact import brute
from solvers.layered.tables import Tables
from tests.test_used_classes_bound import PLANS_PER_PROBLEM, SEEDS

SHARES = tuple(0.001 * 1.5 ** i for i in range(18))  # interval edges, shares of the trivial bound (0.1 % … 99 %)


def _fastest_by_interval(problem, edges: list[float]) -> dict[tuple[int, int], float]:
    """(D ≥ 2, interval index) → the least T of the enumerated plans whose T_dp lies in it."""
    fastest: dict[tuple[int, int], float] = {}
    for pipes in itertools.islice(brute.enumerate_plans(problem), PLANS_PER_PROBLEM):
        if len(pipes) < 2:
            continue
        # T and T_dp as the evaluator prices them, without its simulated schedule (a third of its time)
        priced = breakdown(problem, brute.plan_table(problem, pipes))
        key = (len(pipes), int(np.searchsorted(edges, priced.dp_time, side="right")) - 1)
        fastest[key] = min(fastest.get(key, np.inf), priced.iteration)
    return fastest


def _cases():
    """Per tiny problem and D ≥ 2: (the test of D, {interval (lo, hi): fastest T of a plan of D
    with T_dp in it}, [U11]'s split of D)."""
    problems = [random_small(seed, tiny=True) for seed in range(SEEDS)] + [random_small(seed) for seed in range(40)]
    for problem in problems:  # (on the larger ones, the fastest of the first plans enumerated)
        tables = Tables(problem)
        edges = [0.0] + [share * tables.trivial_bound for share in SHARES] + [np.inf]
        by_d = {d: class_types(tables, d) for d in range(1, tables.max_pipelines + 1)}
        b = breakpoints(by_d[1], 3 * tables.trivial_bound)
        own, bare = usage_tables(by_d, b), usage_tables(by_d, b, own=set())
        levels = tuple(share * tables.trivial_bound for share in LEVEL_SHARES)
        fastest = _fastest_by_interval(problem, edges)
        for d in sorted({d for d, _ in fastest}):
            split = SyncLevelSplit(types=by_d[d], b=b, own=own[d], bare=bare[d], micro=tables.total_micro,
                                   levels=levels, deadline=np.inf, extended=True)
            yield (AlignedTest.of(by_d[d], b, tables.total_micro),
                   {(edges[i], edges[i + 1]): t for (e, i), t in fastest.items() if e == d}, split)


@pytest.fixture(scope="module")
def cases():
    return list(_cases())


def test_the_aligned_test_never_refutes_the_fastest_plan_of_its_interval(cases) -> None:
    tried = 0
    for test, by_interval, _ in cases:
        for (lo, hi), t in by_interval.items():
            if hi < np.inf and test.crossing_allowance(hi) <= aligned.MAX_CROSSING:
                tried += 1
                assert not test.refuted(t * (1 + 1e-9), lo, hi), (test.types.pipelines, lo, hi, t)
    assert tried >= 100, tried


def test_the_level_split_with_alignment_never_refutes_the_fastest_plan_of_a_d(cases) -> None:
    for _, by_interval, split in cases:
        t = min(by_interval.values())
        assert not split.refuted(t * (1 + 1e-9)), (split.types.pipelines, t)


def test_on_hetero1_7b_alignment_refutes_what_the_tables_do_not_and_keeps_the_heuristics_plan() -> None:
    """hetero-1 (10 GbE between machines) 7B, D = 4: the usage table's own test leaves 15.5 s
    open (it refutes up to 15.22 s; [U11], measured: 15.237 s); the aligned test refutes it for
    T_dp below 0.118 s (at most 0, 0 and 1 crossing layers in the three intervals). The
    heuristic's D = 4 plan (16.659 s, T_dp 0.190 s) is not refuted in its interval."""
    problem = load_problem("hetero1-llama2-7b")
    tables = Tables(problem)
    types = class_types(tables, 4)
    b = breakpoints(types, 16.7)
    test = AlignedTest.of(types, b, tables.total_micro)
    own = usage_tables({4: types}, b)[4]
    assert not integer.refuted(own, 4, tables.total_micro, 15.5)
    edges = [0.0] + [share * tables.trivial_bound for share in LEVEL_SHARES]
    low = [(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi < 0.12]
    assert [test.crossing_allowance(hi) for _, hi in low] == [0, 0, 1]
    assert all(test.refuted(15.5, lo, hi) for lo, hi in low)
    # the heuristic's own D = 4 plan: a D = 4 test says nothing about its D = 2 plans
    # (at the moves' least work: the same plan as 1,600 structures, in a third of the time; a work
    # limit, where a 10 s limit stopped the moves by the clock on a busy machine)
    four = HeuristicOptions(pipelines=(4,), move_evaluations=400)
    estimate = evaluate(problem, solve_with(problem, SolverOptions(time_limit_s=60, threads=1), four).plan)
    assert len(estimate.pipelines) == 4
    lo = max(e for e in edges if e <= estimate.dp_s)
    hi = min(e for e in edges if e > estimate.dp_s)
    assert not test.refuted(estimate.iteration_s * (1 + 1e-9), lo, hi), (estimate.iteration_s, estimate.dp_s)


def test_taking_every_layer_as_local_refutes_plans_that_exist(cases, monkeypatch) -> None:
    """Without the crossing layers T_dp allows (x = 0 in every interval) the test refutes real
    plans: the allowance is needed."""
    monkeypatch.setattr(AlignedTest, "crossing_allowance", lambda self, ceiling: 0)
    wrong = sum(test.refuted(t * (1 + 1e-9), lo, hi) for test, by_interval, _ in cases
                for (lo, hi), t in by_interval.items() if hi < np.inf)
    assert wrong >= 3, wrong


def test_an_interval_never_refutes_the_fastest_plan_in_it(cases) -> None:
    """[U13]: [U12], or every case of [U10] with the caps of `hi` and the lift of `lo` at once, or both
    halves of the interval (each tested the same way)."""
    tried = 0
    for _, by_interval, split in cases:
        if split.own.crossing is None:
            continue
        for (lo, hi), t in by_interval.items():
            if hi < np.inf:
                tried += 1
                assert not split.interval_refuted(t * (1 + 1e-9), lo, hi), (split.types.pipelines, lo, hi, t)
    assert tried >= 100, tried


@pytest.fixture
def uncached(cases):
    """The cases with their splits' kept tables and hints cleared before and after: a test that
    changes how a table is built must not find, nor leave, tables built the other way."""
    def clear():
        for _, _, split in cases:
            split.kept.clear()
            split.hint.clear()
    clear()
    yield cases
    clear()


def test_lifting_by_the_top_of_the_interval_refutes_plans_that_exist(uncached, monkeypatch) -> None:
    """The lift is the interval's floor: lifting by its ceiling refutes real plans, so these
    problems see where T_dp lies in an interval."""
    lift_at_top = SyncLevelSplit._case_table
    monkeypatch.setattr(SyncLevelSplit, "_case_table",
                        lambda self, lo, hi, unshared, w, local=None: lift_at_top(self, hi, hi, unshared, w, local))
    wrong = _wrongly_refuted(uncached)
    assert wrong >= 3, wrong


def _wrongly_refuted(cases) -> int:
    """Intervals whose fastest plan `_cases_refuted` refutes (0 unless a test is mutated)."""
    return sum(split._cases_refuted(t * (1 + 1e-9), lo, hi) for _, by_interval, split in cases
               if split.own.crossing is not None for (lo, hi), t in by_interval.items() if hi < np.inf)


def test_every_layer_of_a_shared_class_crossing_refutes_plans_that_exist(uncached, monkeypatch) -> None:
    """[U15]: a shared class's stages hold up to μ_k local layers; with none allowed (μ_k taken
    as 0 in every cell) the caps refute real plans."""
    local = sync_level.local_capped_types
    monkeypatch.setattr(sync_level, "local_capped_types", lambda types, k, most, omega: local(types, k, 0, omega))
    wrong = _wrongly_refuted(uncached)
    assert wrong >= 3, wrong


def _gen24(seed: int, d: int, top: float) -> tuple[SyncLevelSplit, int]:
    """The split of D on the generated 24-GPU cluster of `seed` (Llama-2 13B), with B/b."""
    problem = generated_problem(generate_cluster(24, "A100-80G:1,RTX4090:1,H20:1", seed), "llama2-13b")
    tables = Tables(problem)
    # the classes and breakpoints the bound's route picks over every D, and D's own tables only
    # (the same arrays as the whole route's, a third of its time)
    by_d, b, _, crossing, _ = route._route_classes(tables, list(range(1, tables.max_pipelines + 1)), top, np.inf,
                                                    {d})
    bare, own = route_tables({d: by_d[d]}, b, np.inf, {d}, crossing)
    split = SyncLevelSplit(types=by_d[d], b=b, own=own[d], bare=bare[d],
                           micro=tables.total_micro, levels=(0.172, 0.344), deadline=np.inf)
    return split, tables.total_micro


@pytest.mark.slow
def test_on_gen24_seed2_the_capped_and_lifted_cases_refute_what_neither_does_alone(monkeypatch) -> None:
    """Generated 24 GPUs (A100-80G, RTX4090, H20 machines of 8), seed 2, D = 3: at 5.88 s every
    case T_dp ≥ ω stays open below ω = 0.344 s, and [0.172, 0.344) with it, where [U12] allows all
    40 layers to cross. The relaxed plan there has two one-stage pipelines of four A100s (40
    crossing layers, 0.68 s of sync) beside one of H20 and 4090 stages: the lift alone keeps it,
    the caps alone forget T_dp ≥ 0.172 s. Both at once refute the whole interval."""
    split, micro = _gen24(2, 3, 6.0)
    assert not integer.refuted(split._above(0.172), 3, micro, 5.88)
    assert split.interval_refuted(5.88, 0.172, 0.344)
    assert not split.aligned.refuted(5.88, 0.172, 0.344)  # all 40 layers may cross
    capped = SyncLevelSplit._case_table
    monkeypatch.setattr(SyncLevelSplit, "_case_table",
                        lambda self, lo, hi, unshared, w, local=None: capped(self, 0.0, hi, unshared, w, local))
    split.kept.clear()
    assert not split.interval_refuted(5.88, 0.172, 0.344)  # the caps alone


@pytest.mark.slow
def test_on_gen24_seed0_the_own_sync_floors_cap_the_shared_classes_too(monkeypatch) -> None:
    """Seed 0 (H20 machines of 4), D = 2, T_dp below 10.8 ms, 6.0 s: with the A100, 4090 and one
    H20 machine shared, the relaxed plan's two pipelines each hold 11 layers on four H20s, whose
    other holder cannot share their machine ([U4] (b): 12.7 ms a layer, 0.14 s in all). Capped by
    that own floor, the case is refuted; capped only on the classes nobody shares, it is not."""
    split, _ = _gen24(0, 2, 6.2)
    assert split._cases_refuted(6.0, 0.0, 0.0108)
    monkeypatch.setattr(sync_level, "own_capped_types", lambda types, omega: types)
    split.kept.clear()
    assert not split._cases_refuted(6.0, 0.0, 0.0108)
