"""The configuration bound (docs/bounds.md) never exceeds brute force's optimum, and the
`colgen` solver returns brute force's optimum, on seeded tiny problems (issue 33); its plan
is never slower than the default heuristic's, and its objective is the evaluator's T.

The full set (seeds 0–159 less the five whose brute force alone takes 3–8 s; 114
feasible) is marked slow; a fast subset runs always, and the slow test runs only the seeds
the fast one does not, in quarters (about 10–15 s each on a shared core); half of them are
`exhaustive`, left to `make test-exhaustive` for the suite's time.
"""

from __future__ import annotations

import itertools

import pytest

from instances.random_small import random_small
from planner.layered.pricing import iteration_time
from planner.solver_info import SolveStatus
from solvers.common import SolverOptions
from solvers.layered.bound.search import configuration_bound
from solvers.layered.bound.solver import solve as solve_colgen
from solvers.layered.exact import brute
from solvers.layered.heuristic import HeuristicOptions, solve_with as own_search
from solvers.layered.tables import Tables

FAST_SEEDS = range(0, 12)
SLOW_BRUTE = {43, 46, 66, 98, 129}  # brute force 3.5–7.7 s each: left out for the suite's time budget
ALL_SEEDS = [seed for seed in range(0, 160) if seed not in SLOW_BRUTE]
OPTIONS = SolverOptions(time_limit_s=20, threads=1)


def _bound_and_optimum(seed: int):
    problem = random_small(seed, tiny=True)
    exact = brute.solve(problem)
    tables = Tables(problem)
    bound = configuration_bound(tables, None, list(range(1, tables.max_pipelines + 1)), float("inf"))
    return problem, exact, bound


def _check(seed: int) -> bool:
    """The checks on one seed; whether brute force found a plan there."""
    problem, exact, bound = _bound_and_optimum(seed)
    result = solve_colgen(problem, OPTIONS)
    if exact.status == SolveStatus.infeasible:
        assert result.plan is None, f"seed {seed}: colgen found a plan where brute force proves none fits"
        return False
    best = exact.objective_s
    assert bound.complete, f"seed {seed}: the bound left a D open without a deadline"
    assert bound.value <= best * (1 + 1e-9), f"seed {seed}: bound {bound.value!r} > optimum {best!r}"
    assert result.plan is not None and result.status == SolveStatus.optimal, f"seed {seed}: {result.status}"
    t = iteration_time(problem, result.plan)
    assert t == pytest.approx(best, rel=1e-6), f"seed {seed}: colgen T {t!r} != brute force {best!r}"
    assert result.objective_s == pytest.approx(t, rel=1e-12)
    assert result.bound_s <= best * (1 + 1e-9)
    return True


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_bound_below_optimum_and_solver_exact_fast(seed: int) -> None:
    _check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("quarter", [0, 1, *(pytest.param(q, marks=pytest.mark.exhaustive) for q in (2, 3))])
# four tests, so that the suite's workers share them; `make test` runs two (60 of the 114 feasible
# seeds), `make test-exhaustive` all four
def test_bound_below_optimum_and_solver_exact_on_the_full_seed_set(quarter: int) -> None:
    seeds = ALL_SEEDS[quarter::4]
    feasible = sum(brute.solve(random_small(seed, tiny=True)).plan is not None for seed in seeds if seed in FAST_SEEDS)
    feasible += sum(_check(seed) for seed in seeds if seed not in FAST_SEEDS)
    # 114 of the 155 seeds are feasible, 25–32 in each quarter
    assert feasible >= 25, f"only {feasible} feasible tiny problems in quarter {quarter}: the exactness set is too small"


@pytest.mark.slow
def test_never_slower_than_the_heuristic_on_a_paper_setting() -> None:
    """On a 16-GPU paper setting, colgen's plan is at most the default heuristic's (same
    options), its objective is the evaluator's T and its bound lies between the trivial one and T."""
    from planner.io import load_problem

    problem = load_problem("homo-a800-2x8-llama2-7b")
    options = SolverOptions(time_limit_s=8, threads=1)
    own = own_search(problem, options, HeuristicOptions())
    result = solve_colgen(problem, options)
    t = iteration_time(problem, result.plan)
    assert t <= own.objective_s * (1 + 1e-12)
    assert result.objective_s == pytest.approx(t, rel=1e-12)
    assert Tables(problem).trivial_bound * (1 - 1e-9) <= result.bound_s <= t


def test_bound_below_the_heuristic_plan_on_homo_2x8() -> None:
    """The bound of a paper setting stays below its heuristic plan's T and above the trivial bound."""
    from planner.io import load_problem

    problem = load_problem("homo-a800-2x8-llama2-7b")
    options = SolverOptions(time_limit_s=10, threads=1)
    own = own_search(problem, options, HeuristicOptions())
    tables = Tables(problem)
    bound = configuration_bound(tables, own.objective_s, [1, 2, 4], float("inf"))
    assert tables.trivial_bound <= bound.value <= own.objective_s


def test_plans_read_back_from_the_tables_are_valid_and_above_the_bound() -> None:
    """The plans read back from the usage tables (docs/bounds.md §8) validate, and none is
    faster than the bound proves possible."""
    from planner.io import load_problem
    from planner.layered.validate import validate
    from solvers.layered.bound.plans import plans_from_bound

    problem = load_problem("homo-a800-2x8-llama2-7b")
    tables = Tables(problem)
    bound = configuration_bound(tables, None, list(range(1, tables.max_pipelines + 1)), float("inf"))
    plans = plans_from_bound(problem, bound, float("inf"))
    assert plans, "no plan read back from the tables"
    for plan in plans:
        assert not validate(problem, plan)
        assert iteration_time(problem, plan) >= bound.value


def test_heuristic_tries_the_machine_aligned_d() -> None:
    """D = a machine's size and D = the number of machines are among the heuristic's candidates."""
    from planner.io import load_problem
    from solvers.layered.heuristic.search import aligned_candidates

    assert aligned_candidates(load_problem("homo-a800-2x8-llama2-7b"), 64) == [2, 8]
    assert aligned_candidates(load_problem("homo-a800-2x8-llama2-7b"), 4) == [2]


def test_a_certificate_that_refutes_the_incumbents_own_d_is_refused(monkeypatch) -> None:
    """A bound that a plan in hand disproves is an error, never a number: with every threshold
    'refuted' (a broken certificate), the incumbent's own D contradicts it."""
    from solvers.layered.bound import integer, search

    problem = random_small(1, tiny=True)
    own = own_search(problem, OPTIONS, HeuristicOptions())
    tables = Tables(problem)
    monkeypatch.setattr(integer, "refuted", lambda *args: True)
    monkeypatch.setattr(search.Master, "refuted", lambda self, v: True)
    with pytest.raises(search.CertificateContradiction, match="the certificate is wrong"):
        configuration_bound(tables, own.objective_s, list(range(1, tables.max_pipelines + 1)), float("inf"),
                            first_d=len(own.plan.pipelines))


class _Info:
    def __init__(self, objective: float, dual: float):
        self.objective_function_value, self.mip_dual_bound = objective, dual


@pytest.mark.parametrize("status, objective, dual, has, expected", [
    ("kOptimal", 7.0, 7.0, True, 7.0),          # solved: the optimum
    ("kTimeLimit", 5.0, 9.0, True, 9.0),        # stopped: its dual bound
    ("kTimeLimit", 5.0, 4.0, True, float("inf")),  # a maximum's bound below its own solution: no proof
    ("kTimeLimit", 0.0, float("inf"), False, float("inf")),
    ("kSolveError", 0.0, 0.0, False, float("inf")),  # failed: proves nothing, refutes nothing
    ("kNotset", 0.0, 0.0, False, float("inf")),
])
def test_only_a_finished_or_limited_solve_proves_an_upper_bound(status, objective, dual, has, expected) -> None:
    import highspy

    from solvers.layered.bound.integer import _proven_upper_bound

    got = _proven_upper_bound(getattr(highspy.HighsModelStatus, status), _Info(objective, dual), has)
    assert got == expected


def test_sync_floor_moves_to_another_machine_once_d_outgrows_it() -> None:
    """[U4]: on 2×8 A800, one-device stages of D = 8 pipelines may all sync inside a machine
    (the floor stays [B3]'s), D = 9 cannot (the floor rises to the between-machine link), and the
    stage that sets b pays at least its own layers' floor."""
    import numpy as np

    from planner.io import load_problem
    from solvers.layered.bound.classes import class_types
    from solvers.layered.bound.usage import widest_stage_sync
    from solvers.layered.exact.bounds import PipelineFloors

    tables = Tables(load_problem("homo-a800-2x8-llama2-7b"))
    one = [i for i, c in enumerate(tables.types) if c.tp == 1]
    for d, raised in ((8, False), (9, True)):
        before = PipelineFloors(tables, d)._last_stage_sync()[0][one].min()
        after = class_types(tables, d).sync_layer[class_types(tables, d).tp == 1].min()
        assert (after > before * (1 + 1e-6)) == raised and after >= before
    types = class_types(tables, 9)
    i = int(np.flatnonzero(types.tp == 1)[0])
    b = np.array([5 * types.per_layer[i]])
    assert widest_stage_sync(types, b)[0] <= 5 * types.sync_layer[i] * (1 + 1e-12)
    assert widest_stage_sync(types, b)[0] > 0


def _own_and_bare(seed: int):
    """Every D's own usage table and bare table of one tiny problem, over breakpoints up to
    twice the trivial bound."""
    from solvers.layered.bound.classes import class_types
    from solvers.layered.bound.pricing import breakpoints
    from solvers.layered.bound.usage import usage_tables

    tables = Tables(random_small(seed, tiny=True))
    by_d = {d: class_types(tables, d) for d in range(1, tables.max_pipelines + 1)}
    b = breakpoints(by_d[1], 2 * tables.trivial_bound)
    return tables, usage_tables(by_d, b), usage_tables(by_d, b, own=set())


@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_the_bare_table_is_below_every_ds_own(seed: int) -> None:
    """The bare table (no sync floor) is one relaxation for every D: never above D's own table,
    and the same as it where D = 1 (no sync)."""
    import numpy as np

    tables, own, bare = _own_and_bare(seed)
    for d in own:
        finite = np.isfinite(own[d].least)
        assert (bare[d].least <= own[d].least).all(), f"seed {seed} D={d}"
        assert np.isfinite(bare[d].least[finite]).all()
    assert np.array_equal(bare[1].least, own[1].least)


@pytest.mark.parametrize("seed", range(0, 40, 7))
def test_one_pass_of_bare_and_own_tables_is_the_two_built_apart(seed: int) -> None:
    """`route_tables` (every D's bare table beside the own tables of some D) builds exactly the
    tables `usage_tables` builds for each kind alone."""
    import numpy as np

    from solvers.layered.bound.classes import class_types
    from solvers.layered.bound.pricing import breakpoints
    from solvers.layered.bound.usage import route_tables, usage_tables

    tables = Tables(random_small(seed, tiny=True))
    by_d = {d: class_types(tables, d) for d in range(1, tables.max_pipelines + 1)}
    b = breakpoints(by_d[1], 2 * tables.trivial_bound)
    own = set(list(by_d)[::2])
    bare, built = route_tables(by_d, b, float("inf"), own, crossing=True)
    alone_bare, alone_own = usage_tables(by_d, b, own=set()), usage_tables(by_d, b)
    assert set(bare) == set(by_d) and set(built) == own
    for d in by_d:
        np.testing.assert_array_equal(bare[d].least, alone_bare[d].least)
    for d in own:
        np.testing.assert_array_equal(built[d].least, alone_own[d].least)
        assert (built[d].crossing is None) == (alone_own[d].crossing is None)
        if built[d].crossing is not None:
            np.testing.assert_array_equal(built[d].crossing, alone_own[d].crossing)


def test_the_bisection_never_claims_past_the_threshold_and_ends_within_its_tolerance() -> None:
    """On a test that refutes exactly v < r: the value reached is ≤ r and within the tolerance
    of r, plain or galloping; galloping from the top takes fewer tests where r lies within 1 %
    of it (the case it is for); the first pass's wider tolerance takes fewer tests still."""
    import random

    from solvers.layered.bound.search import FIRST_PASS_TOLERANCE, RELATIVE_TOLERANCE, DBound, _bisect

    rng, tests = random.Random(7), {}
    for _ in range(300):
        floor, top = 1.0, rng.uniform(1.8, 3.0)  # r stays above the floor
        r = top * (1 - rng.choice([rng.uniform(0, 0.01), rng.uniform(0, 0.4)]))
        for gallop in (False, True):
            for tolerance in (RELATIVE_TOLERANCE, FIRST_PASS_TOLERANCE):
                asked = []
                entry = DBound(1, floor)
                _bisect(lambda v: asked.append(v) or v < r, entry, floor, top, float("inf"), gallop=gallop,
                        tolerance=tolerance)
                assert entry.done and r - 2 * tolerance * top <= entry.refuted <= r, (r, top, gallop, tolerance)
                tests.setdefault((gallop, tolerance), []).append((r >= 0.99 * top, len(asked)))
    near = {key: sum(n for close, n in runs if close) for key, runs in tests.items()}
    assert near[True, RELATIVE_TOLERANCE] < 0.8 * near[False, RELATIVE_TOLERANCE], near
    every = {key: sum(n for _, n in runs) for key, runs in tests.items()}
    for gallop in (False, True):
        assert every[gallop, FIRST_PASS_TOLERANCE] < 0.85 * every[gallop, RELATIVE_TOLERANCE], every


def test_the_climb_never_claims_past_the_threshold_and_keeps_each_step_refuted() -> None:
    """[U11]'s refinement climbs from below (`_climb`): on a test that refutes exactly v < r the
    value reached is ≤ r, within the tolerance of min(r, ceiling), and done once it reaches the
    ceiling; where the test stops answering (the deadline), what it refuted before stays."""
    import random

    from solvers.layered.bound.search import RELATIVE_TOLERANCE, DBound, _climb

    rng = random.Random(11)
    for _ in range(300):
        lo = rng.uniform(1.0, 3.0)
        ceiling = lo * (1 + rng.uniform(1e-4, 4e-3))
        r = lo * (1 + rng.uniform(0, 5e-3))
        entry, asked = DBound(1, lo), []
        _climb(lambda v: asked.append(v) or v < r, entry, (lo, ceiling), float("inf"), (ceiling - lo) / 8)
        target = min(r, ceiling)
        assert entry.refuted <= r and entry.refuted >= target - 2 * RELATIVE_TOLERANCE * ceiling, (lo, r, ceiling)
        assert entry.refuted >= lo and asked == sorted(set(asked), key=asked.index)
        if r > ceiling:
            assert entry.done and entry.refuted == ceiling
    entry, answers = DBound(1, 1.0), iter([True, True, False])
    _climb(lambda v: next(answers, False), entry, (1.0, 1.002), -1.0, 2.5e-4)  # past the deadline: nothing asked
    assert entry.refuted == 1.0 and next(answers) is True
    entry, seen = DBound(1, 1.0), []
    step = _climb(lambda v: seen.append(v) or len(seen) <= 2, entry, (1.0, 1.002), float("inf"), 2.5e-4)
    assert entry.refuted == seen[1] and seen[0] < seen[1] < seen[2]  # two steps refuted, kept
    assert seen[1] - seen[0] == pytest.approx(2 * (seen[0] - 1.0)) and step == pytest.approx(1e-3)


def test_the_refinement_raises_tied_d_in_turn_and_stops_at_each_one_s_threshold(monkeypatch) -> None:
    """[U11]'s refinement on fake tests (D refutes exactly v < r_D, every D tied at first): in
    the first round each D is raised one step of RAISE_STEP·CLIMB_FIRST, so none gets further
    ahead of the least (the rule the bound, their least, needs); no D ever gets more than
    RAISE_STEP ahead; at the end the least value is within the tolerance of min(r_D, top) and
    every D's value below its r_D."""
    import random
    from types import SimpleNamespace

    from solvers.layered.bound import search

    rng = random.Random(5)
    for _ in range(20):
        ds, top = list(range(1, rng.randint(3, 7))), 1.05
        r = {d: 1.0 + rng.uniform(0.005, 0.04) for d in ds}
        result = search.ConfigurationBound(per_d={d: search.DBound(d, 1.0, done=True) for d in ds}, floor=0.5)
        spreads = []  # (tests asked before, spread of the D's values)

        def fake_test(tables, route, d, rent=None, deadline=None):
            def refuted(v: float) -> bool:
                values = [e.refuted for e in result.per_d.values()]
                if min(values) < min(r.values()) * (1 - search.RAISE_STEP):
                    spreads.append((len(spreads), max(values) - min(values)))
                return v < r[d]
            refuted.split = None
            return refuted

        monkeypatch.setattr(search, "_test", fake_test)
        route = SimpleNamespace(used={d: None for d in ds})
        search._raise_by_levels(None, route, result, (top, float("inf")), lambda s: None, None, None)
        first_round = [spread for asked, spread in spreads if asked <= len(ds)]
        assert max(first_round) <= search.RAISE_STEP * search.CLIMB_FIRST * top * (1 + 1e-9)
        assert max(spread for _, spread in spreads) <= search.RAISE_STEP * top * (1 + 1e-9)
        least = min(min(r.values()), top)
        assert min(e.refuted for e in result.per_d.values()) >= least * (1 - 2 * search.RELATIVE_TOLERANCE)
        assert all(result.per_d[d].refuted < r[d] for d in ds)


@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_the_lp_shortcut_refutes_exactly_what_the_integer_programme_does(seed: int, monkeypatch) -> None:
    """The LP relaxation only refutes where the integer programme also does: the test's answer
    over a grid of thresholds is the same with and without it."""
    import numpy as np

    from solvers.layered.bound import integer

    tables, own, _ = _own_and_bare(seed)
    thresholds = np.linspace(tables.trivial_bound, 2 * tables.trivial_bound, 9)
    with_lp = {(d, v): integer.refuted(own[d], d, tables.total_micro, v) for d in own for v in thresholds}
    full = integer._most_micro
    monkeypatch.setattr(integer, "_most_micro",
                        lambda *a, integral=True, **kw: full(*a, **kw) if integral else (np.inf, None))
    without = {(d, v): integer.refuted(own[d], d, tables.total_micro, v) for d in own for v in thresholds}
    assert with_lp == without


def test_the_spread_floor_holds_for_every_plan_of_the_tiny_problems() -> None:
    """[U7]: once D exceeds every machine's devices, T ≥ the trivial bound + the floor on T_dp of
    holders across machines — checked against every plan brute force enumerates (the evaluator's
    T), on the tiny problems where some D reaches it."""
    checked = 0
    for seed in range(0, 60):
        problem = random_small(seed, tiny=True)
        tables = Tables(problem)
        for pipes in itertools.islice(brute.enumerate_plans(problem), 4000):
            floor = tables.spread_floor(len(pipes))
            if floor > 0:
                checked += 1
                plan = brute.make_plan(problem, pipes)
                assert iteration_time(problem, plan) >= (tables.trivial_bound + floor) * (1 - 1e-9), seed
    assert checked >= 1000, checked


def test_the_least_brackets_are_narrowed_least_first_and_never_past_their_thresholds(monkeypatch) -> None:
    """After the first pass (brackets FIRST_PASS_TOLERANCE wide), `_narrow_least` narrows the D that
    hold the least value to RELATIVE_TOLERANCE, in turn while they stay least, never claiming past
    each D's true threshold; a D above the least, or one refuted at another D's value (no bracket),
    is left as it was."""
    from solvers.layered.bound import search
    from solvers.layered.bound.search import RELATIVE_TOLERANCE, ConfigurationBound, DBound

    truth = {1: 10.05, 2: 10.02, 3: 10.5}  # each D's test refutes exactly v < truth[d]
    monkeypatch.setattr(search, "_test", lambda tables, route, d, rent=None, deadline=None: lambda v: v < truth[d])
    result = ConfigurationBound(per_d={1: DBound(1, 10.0, True, None), 2: DBound(2, 10.0, True, 10.03),
                                       3: DBound(3, 10.48, True, 10.5)}, floor=9.0, complete=True)
    search._narrow_least(None, None, result, float("inf"), lambda s: None)
    two = result.per_d[2]
    assert two.refuted <= truth[2] <= two.feasible_at
    assert two.feasible_at - two.refuted <= RELATIVE_TOLERANCE * two.feasible_at
    assert (result.per_d[1].refuted, result.per_d[1].feasible_at) == (10.0, None)  # no bracket: [U11] raises it
    assert (result.per_d[3].refuted, result.per_d[3].feasible_at) == (10.48, 10.5)  # not the least


def test_an_incomplete_bound_names_the_d_the_time_limit_stopped():
    """The note of a bound cut short says which D were still being bisected (their refuted value
    counts, the others are finished): 'D 2-3 stopped by the time limit', not only 'not every D'."""
    from solvers.layered.bound.search import ConfigurationBound, DBound
    from solvers.layered.bound.solver import _unexamined

    config = ConfigurationBound(per_d={1: DBound(1, 5.0, done=True), 2: DBound(2, 4.0), 3: DBound(3, 4.5),
                                       4: DBound(4, 9.0, done=True)}, floor=3.0)
    assert config.unfinished == [2, 3] and config.value == pytest.approx(4.0, rel=1e-6)
    assert "D 2-3 stopped by the time limit" in _unexamined(config)
    assert _unexamined(ConfigurationBound(per_d=config.per_d, floor=3.0, complete=True)) == ""


def test_the_exact_bounds_skip_a_sweep_of_too_many_micro_batches(tmp_path):
    """`DBounds.fits` sweeps (B/b + 1)² × allocations booleans: at B/b = 65,536 on two 1-GPU
    machines that was 17 GB before any deadline (10⁶: a MemoryError). Past MAX_REACH_CELLS the
    bounds are not affordable, whatever the time; the exact solver still returns the plan."""
    from planner.io import load_problem
    from solvers.layered.exact import cpsat
    from solvers.layered.exact.bounds import MAX_REACH_CELLS, PipelineFloors

    (tmp_path / "p.yaml").write_text("name: t\ncluster: tiny-2\nmodel: tiny\n"
                                     "training: {seq_len: 128, global_batch: 64, micro_batch: 1}\n")
    problem = load_problem(tmp_path / "p.yaml")
    for micro, affordable in ((64, True), (65536, False), (10**6, False)):
        big = problem.model_copy(update={"training": problem.training.model_copy(
            update={"global_batch": micro * problem.training.micro_batch})})
        floors = PipelineFloors(Tables(big))
        assert floors.affordable(3600.0) is affordable
        assert ((micro + 1) ** 2 * floors.num_allocations <= MAX_REACH_CELLS) is affordable
    result = cpsat.solve(big, SolverOptions(time_limit_s=5))
    assert result.plan is not None and iteration_time(big, result.plan) == pytest.approx(result.objective_s)


@pytest.mark.parametrize("seed", range(0, 40, 5))
def test_the_prefix_tables_of_shuffled_breakpoints_are_the_sorted_ones_shuffled(seed: int) -> None:
    """The DP takes the breakpoints that admit a layer count as a run of rows where the limits rise
    with b (every caller's sorted b), else as a mask: both give the same table, row for row."""
    import numpy as np

    from solvers.layered.bound.classes import class_types
    from solvers.layered.bound.pricing import breakpoints
    from solvers.layered.bound.usage import prefix_table, stage_sets

    tables = Tables(random_small(seed, tiny=True))
    types = class_types(tables, min(2, tables.max_pipelines))
    b = breakpoints(types, 2 * tables.trivial_bound)
    shuffled = np.random.default_rng(seed).permutation(len(b))
    assert not (np.diff(b[shuffled]) >= 0).all()
    np.testing.assert_array_equal(prefix_table(types, b[shuffled]), prefix_table(types, b)[shuffled])
    sorted_sets, shuffled_sets = stage_sets(types, b), stage_sets(types, b[shuffled])
    for role, table in sorted_sets.items():
        np.testing.assert_array_equal(shuffled_sets[role], table[shuffled], err_msg=role)
