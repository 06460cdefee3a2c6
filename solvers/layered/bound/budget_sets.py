"""The configuration bound under a budget, by machine sets ([P8], docs/bounds.md §4b).

A plan within `budget_per_hour` rents a set of machines the budget affords, and every such set
lies inside a maximal affordable one (`solvers.rental.maximal_sets`, listed up to
interchangeable machines, whose restricted problems are the same up to renaming). So the least,
over the maximal sets, of each set's own configuration bound (the problem restricted to the
set, no budget) bounds every plan within the budget. The whole problem's bound under the budget
([U6] on the usage route, [P5] on the LP route) bounds them too, so the larger of the two holds.

Why both: a maximal set is a fraction of a large menu, so its usage tables often fit where the
whole menu's do not, and the integer test is much stronger than the LP certificate (offers at
13/h: the whole menu's LP 12.13 s, the six sets' least 12.65 s, 6 s for all six). Where the
sets are large (offers at 25/h, seven machines of three types) they take the LP route
themselves and the whole menu's budgeted LP is the stronger.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.problem import Problem
from solvers import rental
from solvers.layered.bound.route import usage_route_fits
from solvers.layered.bound.search import ConfigurationBound, configuration_bound
from solvers.layered.tables import Tables, explain_infeasible

SETS_SHARE = 0.5  # of the time: the maximal sets' bounds (the rest, and what they leave: the whole's)
MAX_SETS = 64  # more maximal sets than this: the whole problem's bound only

# Another solver's proven lower bound on a set's restricted problem within some seconds (None:
# none proven). The caller supplies it (CP-SAT's, in bench_frontier), so that this package never
# imports the exact solvers.
SetExactBound = Callable[[Problem, float], float | None]


@dataclass(frozen=True)
class SetBound:
    """One maximal affordable set's bound (machine indices of the whole problem)."""

    machines: tuple[int, ...]
    bound: ConfigurationBound | None  # None: no plan fits on the set (it holds no layer split)
    settled: bool = True  # the search ended before its deadline: more time would not raise it
    exact: float | None = None  # another solver's proven bound on the set (`refine_least`), if asked

    @property
    def value(self) -> float:
        if self.bound is None:
            return math.inf
        return max(self.bound.value, self.exact or -math.inf)  # both hold: the larger


@dataclass(frozen=True)
class BudgetBound:
    """The larger of the whole problem's budgeted bound and the least of the sets' bounds."""

    whole: ConfigurationBound
    sets: tuple[SetBound, ...]  # empty: not listed (no budget, or too many sets)

    @property
    def by_sets(self) -> float | None:
        """min over the maximal sets of their bounds; None where the sets were not bounded."""
        return min(s.value for s in self.sets) if self.sets else None

    @property
    def value(self) -> float:
        return max(self.whole.value, self.by_sets if self.sets else -math.inf)

    @property
    def complete(self) -> bool:
        """Whether the value's side examined every D (the sets' side: every set's)."""
        if self.sets and self.by_sets >= self.whole.value:
            return all(s.bound is None or s.bound.complete for s in self.sets)
        return self.whole.complete


def maximal_sets_or_none(problem: Problem) -> list[tuple[int, ...]] | None:
    """The maximal affordable machine sets, or None without a budget, when the budget affords
    every machine, or when there are too many to list or bound one by one."""
    budget = problem.budget_per_hour
    if budget is None or rental.affords_everything(problem, budget):
        return None
    try:
        sets = rental.maximal_sets(problem, budget)
    except ValueError:  # too many to list
        return None
    return sets if 0 < len(sets) <= MAX_SETS else None


def set_tables(problem: Problem, machines: tuple[int, ...]) -> Tables | None:
    """The tables of the problem restricted to `machines`, without a budget; None when no plan
    fits on them (they hold no layer split)."""
    tables = Tables(rental.restricted(problem, machines)[0])
    return None if explain_infeasible(tables) else tables


def set_bound(machines: tuple[int, ...], tables: Tables | None, incumbent: float | None, deadline: float) -> SetBound:
    """The configuration bound of one maximal set (its restricted problem's `tables`)."""
    if tables is None:
        return SetBound(machines, None)
    bound = configuration_bound(tables, incumbent, list(range(1, tables.max_pipelines + 1)), deadline)
    return SetBound(machines, bound, settled=bound.complete and time.perf_counter() < deadline)


def bound_sets(sets: list[tuple[int, ...]], tables: list[Tables | None], incumbent: float | None, end: float,
               log=lambda s: None) -> list[SetBound]:
    """Each set's bound until `end`, in two passes: the first half of the time shared evenly
    (what a set leaves passes to the next: most are refuted at the incumbent in seconds), then
    the rest to the sets the deadline cut (a D left open, or [U11]'s refinement stopped), least
    bound first, each searched again with its larger share (the larger of its two bounds kept:
    both hold). Gen-64 seed 3 at 14.24/h: the 13 sets were complete in 24 s of 200, the least
    two (H800 + RTX 4090 machines, 12.7939 s) cut at their 7.7 s; given 60 s, 12.7944 s."""
    bounded: list[SetBound] = []
    first_end = time.perf_counter() + 0.5 * max(end - time.perf_counter(), 0.0)
    for i, machines in enumerate(sets):
        share = (first_end - time.perf_counter()) / (len(sets) - i)
        bounded.append(set_bound(machines, tables[i], incumbent, time.perf_counter() + max(share, 0.0)))
    still = sorted((i for i, b in enumerate(bounded) if b.bound is not None and not b.settled),
                   key=lambda i: bounded[i].value)
    for j, i in enumerate(still):
        share = (end - time.perf_counter()) / (len(still) - j)
        again = set_bound(sets[i], tables[i], incumbent, time.perf_counter() + max(share, 0.0))
        if again.value > bounded[i].value:
            bounded[i] = again
    log(f"budget bound: {len(sets)} maximal sets, least {min(b.value for b in bounded):.6g} s "
        f"({len(still)} searched again)")
    return bounded


def refine_least(problem: Problem, bounded: list[SetBound], exact: SetExactBound, end: float,
                 incumbent: float | None, log=lambda s: None) -> list[SetBound]:
    """Only the least set's bound counts, so while time is left the set that holds the least
    bound (below the incumbent, not yet refined) gets another solver's bound ([P8]: any valid
    bound of a set will do, and the larger of two holds), with an even share of the time among
    the sets still below the incumbent: the least rises only once every one of them has.
    Gen-64 seed 3 at 14.24/h: the least set (4 H800 + 8 RTX 4090) settled at 12.793 s in the
    configuration bound; CP-SAT proves 12.869 s there in 277 s (the heuristic's plan: 13.238 s)."""
    bounded = list(bounded)
    while time.perf_counter() < end:
        waiting = [j for j, b in enumerate(bounded) if b.exact is None and b.bound is not None
                   and (incumbent is None or b.value < incumbent)]
        i = min(range(len(bounded)), key=lambda j: bounded[j].value)
        if i not in waiting:
            break
        least = bounded[i]
        found = exact(rental.restricted(problem, least.machines)[0], (end - time.perf_counter()) / len(waiting))
        bounded[i] = replace(least, exact=found if found is not None else -math.inf)
        log(f"budget bound: set {least.machines} {least.value:.6g} → {bounded[i].value:.6g} s by the exact solver")
    return bounded


def on_usage_route(tables: list[Tables | None], incumbent: float | None, seconds: float) -> bool:
    """Whether every set that holds a plan would take the usage route given all `seconds`. One
    on the LP route has no budget row and a fraction of the menu, and bounded below the whole
    menu's budgeted LP wherever measured (offers at 25 and 48/h, the 64-GPU menus at 50/h:
    6.32 against 6.67 s, 2.94 against 3.54, 3.38 against 3.60); the least over the sets is at
    most its bound, so such a set pass only takes time from the whole problem's bound."""
    return all(t is None or usage_route_fits(t, incumbent, seconds) for t in tables)


def budget_bound(problem: Problem, incumbent: float | None, deadline: float, log=lambda s: None,
                 exact: SetExactBound | None = None) -> BudgetBound:
    """[P8]: the maximal sets' bounds with SETS_SHARE of the time (`bound_sets`; with `exact`,
    what they leave of it to the least set's exact bound, `refine_least`), then the whole
    problem's budgeted bound until `deadline`; `incumbent` (a plan within the budget) is every
    search's first threshold."""
    start = time.perf_counter()
    sets = rental.distinct_sets(problem, maximal_sets_or_none(problem) or [])
    per_set = [set_tables(problem, machines) for machines in sets]
    share_end = start + SETS_SHARE * (deadline - start)
    if sets and not on_usage_route(per_set, incumbent, share_end - time.perf_counter()):
        log(f"budget bound: some of the {len(sets)} maximal sets would take the LP route; the whole problem's "
            f"bound alone")
        sets, per_set = [], []
    bounded = bound_sets(sets, per_set, incumbent, share_end, log) if sets else []
    if bounded and exact is not None:
        bounded = refine_least(problem, bounded, exact, share_end, incumbent, log)
    tables = Tables(problem)
    whole = configuration_bound(tables, incumbent, list(range(1, tables.max_pipelines + 1)), deadline, log=log)
    return BudgetBound(whole=whole, sets=tuple(bounded))
