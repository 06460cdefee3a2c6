"""The configuration bound over every D (docs/bounds.md §4): per D, the largest threshold
the certificate refutes, found by bisection; the bound is the least over D.

The test of a threshold is the integer usage test ([U2], `integer.py`) when the usage table
fits the time left (classes of identical machines, else classes by GPU). There D values are
visited outward from the incumbent's D, and a D is only bisected when it could lower the
bound found so far: it is first tested at the current least (refuted there: it cannot lower
it); the first D is tested at the incumbent. Otherwise the LP certificate of `master.py`
tests ranges of D at once, split where the bound is set (`_lp_ranges`, docs/bounds.md §4a).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from planner.prices import spendable
from solvers.layered.bound import integer
from solvers.layered.bound.classes import ClassTypes, class_types, range_types
from solvers.layered.bound.master import Master
from solvers.layered.bound.fewest_stages import FewestStagesCases, single_stage_floor
from solvers.layered.bound.route import UsageRoute, _usage_route
from solvers.layered.bound.sync_level import LEVEL_SHARES, SyncLevelSplit
from solvers.layered.bound.usage import UsageTable
from solvers.layered.tables import Tables

RELATIVE_TOLERANCE = 2e-4  # bisection stops when the bracket is this narrow
# the first pass's bisections stop this wide, so that every D is examined before any is refined:
# at 2e-4 gen-64 seed 1 bisected D = 1…6 in 600 s and its bound was the trivial one (the least D's
# brackets are then narrowed to RELATIVE_TOLERANCE, `_narrow_least`, before [U11]'s refinement)
FIRST_PASS_TOLERANCE = 2e-3
FLOAT_SLACK = 1e-9  # relative: the bound is deflated by this against float noise (docs/bounds.md §5)
# `_bisect`'s first step down from another D's value (hetero-2 7B: D = 1…8 within 0.7 % of each other)
GALLOP_STEP = 0.0025
RAISE_STEP = 0.002  # [U11]'s refinement raises a D at most this share above where it stands, then the next
# the refinement's first threshold lies this share of the raise step above where a D stands (`_climb`)
CLIMB_FIRST = 0.125


@dataclass
class DBound:
    """What is proved for one D: no plan with D pipelines has T ≤ `refuted` (0: nothing)."""

    pipelines: int
    refuted: float = 0.0
    done: bool = False  # the bisection finished (or the D cannot lower the bound)
    feasible_at: float | None = None  # the least threshold tested and not refuted (plans are built there)


@dataclass
class ConfigurationBound:
    """The configuration bound of a problem: per D what is refuted, and the bound over all."""

    per_d: dict[int, DBound] = field(default_factory=dict)
    floor: float = 0.0  # a bound every plan satisfies (the trivial one), used where a D is open
    complete: bool = False  # every D was examined
    usage: dict[int, UsageTable] | None = field(default=None, repr=False)  # the usage route's tables per D
    types: dict[int, ClassTypes] | None = field(default=None, repr=False)  # their class-level types per D
    rent: integer.Rent | None = None  # the problem's budget over the usage route's classes ([U6])
    fewest: FewestStagesCases | None = field(default=None, repr=False)  # [U16]'s cases of few stages (their tables)

    @property
    def unfinished(self) -> list[int]:
        """The D whose bisection the deadline stopped (what they refuted still counts)."""
        return sorted(d for d, b in self.per_d.items() if not b.done)

    @property
    def value(self) -> float:
        """min over D of what is refuted there (never below the floor), deflated by FLOAT_SLACK."""
        if not self.per_d:
            return self.floor
        least = min(max(d.refuted, self.floor) for d in self.per_d.values())
        return least * (1 - FLOAT_SLACK)


def configuration_bound(tables: Tables, incumbent: float | None, d_values: list[int], deadline: float,
                        log=lambda s: None, first_d: int | None = None) -> ConfigurationBound:
    """The bound over `d_values` (each D's relaxation is valid for its plans only), with the
    incumbent as the first threshold (None: the bisection starts from twice the trivial bound);
    D is visited outward from `first_d` (the incumbent's D). On the usage route a D without a
    table of its own is first tested with the bare table at the least refuted so far; the D it
    cannot refute there are bisected afterwards (`_bisect_pending`, docs/bounds.md [U5])."""
    floor = tables.trivial_bound
    # [U7]: once D outgrows every machine, T ≥ the trivial bound + a floor on T_dp; the D it
    # lifts above the first threshold are refuted before any search, and the others' LP ranges
    # and usage tables cover fewer D
    result = ConfigurationBound(per_d={d: DBound(d, floor + tables.spread_floor(d)) for d in d_values}, floor=floor)
    top = incumbent if incumbent is not None else 2 * floor
    d_values = _open_after_spread(result, d_values, top, incumbent, first_d, log)
    if not d_values:
        result.complete = True
        return result
    route = _usage_route(tables, d_values, top, deadline, log, first_d)
    if route is None:
        _lp_ranges(tables, result, top, deadline, log, incumbent, first_d, d_values)
        return result
    result.usage, result.types, result.fewest = route.used, route.types, route.fewest
    result.rent = integer.Rent.of(route.types[d_values[0]], tables.budget)
    pending = []
    for d in outward(d_values, first_d):
        if time.perf_counter() > deadline:
            log(f"configuration bound: time limit before D={d}")
            return result
        entry, least = result.per_d[d], _least(result, top, floor)
        if d not in route.own:
            if entry.refuted >= least or _test(tables, route, d, result.rent)(least):  # d's table is the bare one
                entry.refuted, entry.done = max(entry.refuted, least), True
                log(f"configuration bound D={d}: no plan with T ≤ {least:.6g} s (bare table)")
            else:
                pending.append(d)
            continue
        _bisect(_test(tables, route, d, result.rent), entry, floor, least, deadline, gallop=least < top,
                tolerance=FIRST_PASS_TOLERANCE)
        _check_incumbent([d], entry.refuted, incumbent, first_d)
        log(f"configuration bound D={d}: no plan with T ≤ {entry.refuted:.6g} s" + ("" if entry.done else " (open)"))
    if pending:
        _bisect_pending(tables, route, result, pending, top, deadline, log)
    result.complete = all(e.done for e in result.per_d.values())
    if result.complete:
        _narrow_least(tables, route, result, deadline, log)
        _raise_by_levels(tables, route, result, (top, deadline), log, incumbent, first_d)
    return result


def _narrow_least(tables: Tables, route: UsageRoute, result: ConfigurationBound, deadline: float, log) -> None:
    """Once every D is examined, the first pass's brackets (FIRST_PASS_TOLERANCE wide) of the D
    that hold the least value are narrowed to RELATIVE_TOLERANCE with the plain test, least
    first, before [U11]'s refinement: it starts from the values a finer first pass would have
    left (on h800-h20-16-24 it had raised D = 2 from its coarse value and stopped 0.06 % lower)."""
    while time.perf_counter() < deadline:
        least = min(e.refuted for e in result.per_d.values())
        open_ = [e for e in result.per_d.values() if e.refuted == least and e.feasible_at is not None
                 and e.feasible_at - e.refuted > RELATIVE_TOLERANCE * e.feasible_at]
        if not open_:
            return
        entry = open_[0]
        _narrow(_test(tables, route, entry.pipelines, result.rent), entry, entry.refuted, deadline)
        if time.perf_counter() <= deadline:
            log(f"configuration bound D={entry.pipelines}: no plan with T ≤ {entry.refuted:.6g} s (narrowed)")


def _raise_by_levels(tables: Tables, route: UsageRoute, result: ConfigurationBound, limits: tuple[float, float],
                     log, incumbent: float | None, first_d: int | None) -> None:
    """With the time left once every D is examined, the D that sets the bound is raised again
    from what it refuted towards the next D's value — with [U11]'s split on T_dp's level and [U12]
    (a D the first pass only tested at the least bound, on its bare table: with [U12] alone) —
    until one stops below that value: a refinement, so the bound is never weaker than without it
    when the time runs out. Each climb (`_climb`) stops RAISE_STEP above where it started (one
    step where other D tie at the least value), so that D tied at the least value are raised
    in turn (hetero-1 13B: D = 2 climbed 1.1 % above D = 3…8 in 530 s while they, which set the
    bound, waited). (Building own tables here for the bare D cost gen-40 seed 2 300 s for
    0.04 %.) `limits`: (the first threshold, the deadline)."""
    (top, deadline), tests, settled, extended, steps = limits, {}, set(), False, {}
    while time.perf_counter() < deadline:
        ranked = sorted((e.refuted, d) for d, e in result.per_d.items())
        before, d = ranked[0]
        if d not in route.used:
            return  # (a D outside the route: [U7] refuted it before any search)
        if d in settled:
            if extended:
                return
            _extend(tests, settled, log)  # [U14] and [U15], in the time [U13] left
            extended = True
            steps.clear()  # a threshold costs more with them: the steps start small again
            continue
        # D tied with it are raised in turn, one step each, so that the bound, the least of them,
        # rises (h800-h20-16-24: D = 2 climbed 0.18 % in 215 s while D = 3…20, which set it, waited);
        # each D's step starts at CLIMB_FIRST of RAISE_STEP and doubles while it refutes (hetero-1 7B:
        # a step cost D = 4 6–10 s whatever its size)
        step = steps.setdefault(d, RAISE_STEP * CLIMB_FIRST * before)
        ceiling = _ceiling(ranked, top, step)
        if ceiling <= before:
            return  # every D refuted at the first threshold already
        if d not in tests:
            tests[d] = _test(tables, route, d, result.rent, deadline)
            if extended and tests[d].split is not None:
                tests[d].split.extend()
        entry = result.per_d[d]
        steps[d] = min(_climb(tests[d], entry, (before, ceiling), deadline, step), RAISE_STEP * before)
        _check_incumbent([d], entry.refuted, incumbent, first_d)
        entry.done = True  # examined before: a climb the deadline cut keeps what it proved
        log(f"configuration bound D={d}: no plan with T ≤ {entry.refuted:.6g} s (again, [U11])")
        if entry.refuted < ceiling:
            settled.add(d)


def _ceiling(ranked: list[tuple[float, int]], top: float, step: float) -> float:
    """Where the climb of the least D (`ranked`: (value, D), least first) stops: at the next D's
    value above it (`top` if none), RAISE_STEP above its own, and one `step` above it where other
    D tie with it."""
    before = ranked[0][0]
    ceiling = min(next((v for v, _ in ranked[1:] if v > before), top), before * (1 + RAISE_STEP))
    return min(ceiling, before + step) if len(ranked) > 1 and ranked[1][0] == before else ceiling


def _extend(tests: dict, settled: set[int], log) -> None:
    """Turn [U14] and [U15] on in every D's split and unsettle them. They refute more but
    cost more per threshold: run from the start, gen-24 seed 4 reached 5.853 s in 600 s against
    5.877 s with [U13] alone (357 s), so they only get the time [U13] leaves."""
    for test in tests.values():
        if test.split is not None:
            test.split.extend()
    settled.clear()
    log("configuration bound: [U11] again with [U14] and [U15]")


def _open_after_spread(result: ConfigurationBound, d_values: list[int], top: float, incumbent: float | None,
                       first_d: int | None, log) -> list[int]:
    """The D that [U7]'s floor leaves open (the others, refuted above `top`, are done)."""
    lifted = [d for d in d_values if result.per_d[d].refuted > top]
    for d in lifted:
        _check_incumbent([d], result.per_d[d].refuted, incumbent, first_d)
        result.per_d[d].done = True
    if lifted:
        log(f"configuration bound D={lifted[0]}..{lifted[-1]}: refuted above {top:.6g} s by the trivial bound and "
            f"the T_dp of holders across machines ([U7])")
    return [d for d in d_values if d not in lifted]


def _least(result: ConfigurationBound, top: float, floor: float) -> float:
    """The least threshold refuted so far over the D that are done (`top` before any)."""
    return min([top] + [max(e.refuted, floor) for e in result.per_d.values() if e.done])


def _test(tables: Tables, route: UsageRoute, d: int, rent: integer.Rent | None = None, deadline: float | None = None):
    """`refuted(v)` of one D: the route's test (`_case_test` on D's table), or every case of [U16]
    refuted — pipelines of s = 1 … FEWEST_SPLIT stages at least, some of exactly s, and those of
    more (`FewestStagesCases`; D's own tables where a refinement, with a `deadline`, asks) — each
    by `_case_test` on its own tables. D = 1 has nothing to sync: the route's test alone. In the
    refinement the cases only run for the D where they refuted a threshold the route's test left
    open before (on hetero-1 7B they cost the refinement 0.4 %: 15.434 → 15.372 s in 600 s)."""
    whole = _case_test(tables, d, route.used[d], route.types[d], route.bare_for(d), d in route.own, rent, deadline)
    cases, built = route.fewest, {}
    if cases is None or d == 1 or not cases.affordable():
        return whole

    def case(s: int):
        if s not in built:  # at the first threshold the route leaves open: each table costs a prefix
            table = cases.table(d, s, deadline)
            if table is None:
                return _refutes_nothing  # the time ran out before its table
            # pipelines of ≥ 1 stage without floors: the route's bare table of D, where it has one
            bare = route.bare_for(d) if s == 1 else None
            bare = cases.bare(d, s) if bare is None else bare
            built[s] = _case_test(tables, d, table, cases.types(d, s), bare, cases.has_own(d, s), rent, deadline)
            if splits.extended and built[s].split is not None:
                built[s].split.extend()
        return built[s]

    def single_refuted(v: float) -> bool:  # [U17]: case 1's one-stage pipeline syncs every layer
        floor, bare = single_stage_floor(route.types[d], v), route.bare_for(d)
        return floor == math.inf or (bare is not None and integer.refuted(bare, d, tables.total_micro, v - floor, rent))

    def refuted(v: float) -> bool:
        if whole(v):
            return True
        if deadline is not None and d not in cases.helped:
            return False  # the refinement's time goes to the route's test where the cases never helped
        if not all(case(s)(v) or (s == 1 and single_refuted(v)) for s in cases.cases()):
            return False
        cases.helped.add(d)
        return True
    splits = _CaseSplits(whole, built)
    refuted.split = splits
    return refuted


def _refutes_nothing(v: float) -> bool:
    return False


@dataclass
class _CaseSplits:
    """[U11]'s splits of every case of [U16] of one D, extended together (`_raise_by_levels`)."""

    whole: object  # the route's test
    cases: dict  # s → case s's test, as built
    extended: bool = False

    def extend(self) -> None:
        self.extended = True
        for test in [self.whole, *self.cases.values()]:
            if test.split is not None:
                test.split.extend()


def _case_test(tables: Tables, d: int, table: UsageTable, types: ClassTypes, bare: UsageTable | None, own: bool,
               rent: integer.Rent | None, deadline: float | None):
    """`refuted(v)` of one D on one usage table: its integer test (under the budget: [U6]); where it
    does not refute v, [U8]'s three cases may: no pipeline spans two machines and all sit on one
    (`one_machine_floor`), or on several (T_dp ≥ `crossing_sync_floor`, above the trivial
    bound or a bare table's T_pipe without any sync), or some pipeline spans two machines (the
    test with one such pipeline, `integer.refuted_spanning`); with a `deadline`, also [U11]'s split
    on T_dp's level with [U12] (a D with only the bare table: the split with [U12] alone)."""
    micro = tables.total_micro
    alone, crossing = tables.one_machine_floor(d), tables.crossing_sync_floor(d)
    by_level = None
    if deadline is not None and d >= 2 and bare is not None:
        by_level = SyncLevelSplit(types=types, b=table.b, own=table if own else None, bare=bare, micro=micro,
                                  rent=rent, deadline=deadline,
                                  levels=tuple(share * tables.trivial_bound for share in LEVEL_SHARES))

    def no_crossing_plan(v: float) -> bool:
        if v < tables.trivial_bound + crossing:
            return True
        return bare is not None and integer.refuted(bare, d, micro, v - crossing, rent)

    def spanning_refuted(v: float) -> bool:
        return (types.hop > 0 and v < alone and no_crossing_plan(v)
                and integer.refuted_spanning(table, types, d, micro, v, rent))

    def refuted(v: float) -> bool:
        return (integer.refuted(table, d, micro, v, rent) or spanning_refuted(v)
                or (by_level is not None and by_level.refuted(v)))
    refuted.split = by_level  # [U11]'s split, for `_raise_by_levels` to extend
    return refuted


@dataclass
class DRange:
    """Consecutive D values (`d_values[lo..hi]`) and what one LP certificate refutes for all of them [P6]."""

    lo: int
    hi: int
    bound: DBound

    def test(self, tables: Tables, d_values: list[int], deadline: float = math.inf):
        """`refuted(v)` for every D of the range at once (under the budget: [P5]); past
        `deadline` it refutes nothing more."""
        fewest, most = d_values[self.lo], d_values[self.hi]
        budget = None if tables.budget is None else spendable(tables.budget)
        types = class_types(tables, most) if fewest == most else range_types(tables, fewest, most)
        return Master(types, budget=budget, fewest=fewest, deadline=deadline).refuted

    def halves(self) -> list[DRange]:
        """Two ranges that split this one, each starting from what it refuted."""
        mid = (self.lo + self.hi) // 2
        return [DRange(lo, hi, DBound(0, refuted=self.bound.refuted)) for lo, hi in ((self.lo, mid), (mid + 1, self.hi))]


def _lp_ranges(tables: Tables, result: ConfigurationBound, top: float, deadline: float, log, incumbent: float | None,
               first_d: int | None, d_values: list[int]) -> None:
    """The LP route over ranges of D (docs/bounds.md [P6]): D = 1 (no sync) alone and every other D
    as one range, each bisected; then the range that sets the bound is split in two and each half
    bisected from where it stood, until that range is one D whose bisection finished (the bound
    cannot rise) or the time runs out. Every D of `d_values` (consecutive, from 1) is covered
    once the first pass finishes."""
    leaves = [DRange(0, 0, DBound(0))] + ([DRange(1, len(d_values) - 1, DBound(0))] if len(d_values) > 1 else [])
    todo = list(leaves)
    while todo:
        if time.perf_counter() > deadline:
            log(f"configuration bound: time limit before D={d_values[todo[0].lo]}..{d_values[todo[0].hi]}")
            break
        leaf = todo.pop(0)
        _bisect(leaf.test(tables, d_values, deadline), leaf.bound, result.floor, top, deadline)
        _cover(result, leaf, d_values, incumbent, first_d, log)
        if not todo:  # the range whose D hold the least: what each D holds counts [U7]'s floor too
            least = min(leaves, key=lambda r: min(result.per_d[d].refuted for d in d_values[r.lo:r.hi + 1]))
            if least.lo == least.hi:
                break  # one D, bisected: no split can raise the bound
            leaves.remove(least)
            todo = least.halves()
            leaves += todo
    result.complete = all(e.done for e in result.per_d.values())


def _cover(result: ConfigurationBound, leaf: DRange, d_values: list[int], incumbent: float | None,
           first_d: int | None, log) -> None:
    """Each D of a bisected range gets what it refuted (a range's refuted value holds for all its D)."""
    ds = d_values[leaf.lo:leaf.hi + 1]
    _check_incumbent(ds, leaf.bound.refuted, incumbent, first_d)
    for d in ds:
        entry = result.per_d[d]
        entry.refuted, entry.done = max(entry.refuted, leaf.bound.refuted), entry.done or leaf.bound.done
    log(f"configuration bound D={ds[0]}..{ds[-1]}: no plan with T ≤ {leaf.bound.refuted:.6g} s"
        + ("" if leaf.bound.done else " (open)"))


def _bisect_pending(tables: Tables, route: UsageRoute, result: ConfigurationBound, pending: list[int],
                    top: float, deadline: float, log) -> None:
    """The D the bare table could not refute at the least bound: each bisected on the bare
    table first (every D examined: the bound is complete, if weaker), then the ones that set
    the bound below the other D's get their own tables in one pass and are bisected again from
    where the bare table left them (own ≥ bare, so that is a valid start)."""
    others = _least(result, top, result.floor)
    for d in pending:
        if time.perf_counter() > deadline:
            log(f"configuration bound: time limit before D={d}")
            return
        entry = result.per_d[d]
        least = _least(result, top, result.floor)
        _bisect(_test(tables, route, d, result.rent), entry, result.floor, least, deadline, gallop=least < top,
                tolerance=FIRST_PASS_TOLERANCE)
        log(f"configuration bound D={d}: no plan with T ≤ {entry.refuted:.6g} s (bare table)"
            + ("" if entry.done else " (open)"))
    lowering = [d for d in pending if result.per_d[d].refuted < others]
    if not lowering:
        return
    log(f"configuration bound: own tables for D={lowering}")
    route.build(lowering, deadline)
    for d in (d for d in lowering if d in route.own):
        if time.perf_counter() > deadline:
            return
        entry = result.per_d[d]
        _bisect(_test(tables, route, d, result.rent), entry, result.floor, others, deadline, gallop=others < top,
                tolerance=FIRST_PASS_TOLERANCE)
        log(f"configuration bound D={d}: no plan with T ≤ {entry.refuted:.6g} s" + ("" if entry.done else " (open)"))


class CertificateContradiction(RuntimeError):
    """A D refuted at a time a known plan of that D reaches: a bound that cannot be true."""


def _check_incumbent(ds: list[int], refuted: float, incumbent: float | None, first_d: int | None) -> None:
    """Raises CertificateContradiction where `ds` (one D or a range) holds the incumbent's D and
    what they refute reaches the incumbent's T."""
    if first_d in ds and incumbent is not None and refuted >= incumbent:
        span = f"D={ds[0]}" if len(ds) == 1 else f"D={ds[0]}..{ds[-1]}"
        raise CertificateContradiction(
            f"configuration bound: {span} refuted at T ≤ {refuted:.6g} s, which the incumbent plan with "
            f"D={first_d} reaches ({incumbent:.6g} s): the certificate is wrong; no bound is reported")


def outward(d_values: list[int], first: int | None) -> list[int]:
    """D values by distance from `first` (the smaller first on ties); as given without one."""
    if first is None:
        return list(d_values)
    return sorted(d_values, key=lambda d: (abs(d - first), d))


def _bisect(refuted, entry: DBound, floor: float, top: float, deadline: float, gallop: bool = False,
            tolerance: float = RELATIVE_TOLERANCE) -> None:
    """Raise entry.refuted from `floor` towards `top`: first `top` itself, then bisection to a
    bracket `tolerance` wide (`refuted(v)`: no plan of this D has T ≤ v). With `gallop` (`top`
    is another D's value, which this D's usually lies just below), the bracket's lower end first
    steps down from `top` by GALLOP_STEP, doubling, and the bisection starts from the first value
    refuted."""
    if refuted(top):
        entry.refuted, entry.done = max(entry.refuted, top), True
        return
    entry.feasible_at = top
    _narrow(refuted, entry, max(floor, entry.refuted), deadline, tolerance, GALLOP_STEP * top if gallop else math.inf)


def _climb(refuted, entry: DBound, bracket: tuple[float, float], deadline: float, step: float) -> float:
    """Raise entry.refuted from lo (refuted) towards the ceiling, `bracket` = (lo, ceiling), from
    below: lo + `step`, the step doubling while each threshold is refuted, then the bracket the
    first threshold that stands leaves is bisected (`_narrow`). Why from below: in the refinement
    the split's capped tables make a threshold just above a refuted one cheap to refute, while one
    that stands costs a full pass over its cases; bisecting from the ceiling down
    (h800-h20-16-24: 68.088 s stood, then the time ran out below it) kept nothing of the time.
    Returns the step a next climb of this D starts with (doubled after each threshold refuted)."""
    lo, ceiling = bracket
    step = max(step, RELATIVE_TOLERANCE * ceiling)
    while time.perf_counter() <= deadline:
        v = min(lo + step, ceiling)
        if not refuted(v):
            entry.feasible_at = v
            _narrow(refuted, entry, lo, deadline)
            return step
        lo = entry.refuted = max(entry.refuted, v)  # each threshold refuted stays proved
        step *= 2
        if v >= ceiling:
            entry.done = True
            return step
    return step


def _narrow(refuted, entry: DBound, lo: float, deadline: float, tolerance: float = RELATIVE_TOLERANCE,
            step: float = math.inf) -> None:
    """Bisect [lo, entry.feasible_at] (lo refuted or a floor, feasible_at tested and not refuted)
    to a bracket `tolerance` wide; a finite `step` gallops down from feasible_at first (`_bisect`)."""
    hi = entry.feasible_at
    while hi - lo > tolerance * hi:
        if time.perf_counter() > deadline:
            entry.refuted = max(entry.refuted, lo)  # what is refuted so far stays proved
            return
        mid = hi - step if hi - step > lo + 0.5 * step else 0.5 * (lo + hi)
        if refuted(mid):
            lo, step = mid, math.inf
        else:
            hi = entry.feasible_at = mid
            step *= 2
    entry.refuted, entry.done = lo, True
