"""The time–rent frontier (docs/prices.md §13): the Pareto-optimal plans by (rent per hour, T) — a
plan is on it when no other plan is at most as dear and at most as slow, and strictly better in
one — and the cheapest per token among them (the cost objective).

Two methods, both over a solver that honours `budget_per_hour` (`solvers.objective.honouring`):
- exact (small clusters): the ε-constraint method over rent levels. The only rents a plan can
  have are the sums of whole machines' rents (`rental.rent_levels`). From the top level down:
  solve min T under rent ≤ r; its plan rents ρ ≤ r; the next level solved is the largest below
  ρ (every level in between has the same least T, which ρ already reaches). A plan whose T ties
  the previous point's replaces it (as cheap or cheaper, as fast). It stops when a level has no
  plan (none below it has one either) or the levels run out. With every solve proven optimal
  each point is proven, and the frontier complete.
- heuristic (large clusters): `levels` budgets spaced geometrically from the cheapest rent that
  can hold the model states to the whole cluster's rent (or the problem's budget), each solved
  under its budget with an equal share of the time left (in `spread` order: a time limit leaves
  gaps, not the cheap end), and the Pareto-optimal plans of them.

The cost objective's proven bound: a plan renting ρ in (r_next, r] (r a solved budget, r_next the
next one solved below) has T ≥ that solve's bound, so cost ≥ ρ_min·bound; below the last level
solved (when the time ran out), T ≥ the trivial bound of the most compute the rent buys.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from planner.base import plural
from planner.kinds import iteration_time
from planner.layered import cost
from planner.layered.cost import StageShape
from planner.prices import cheaper_than, cost_of, rent_per_hour, spendable
from planner.problem import Objective, Problem
from planner.solver_info import SolveStatus
from solvers import rental
from solvers.common import SolveResult, SolverOptions

TIE = 1e-9  # relative: two plans' T within this are one T (float rounding of the evaluator)
DEFAULT_LEVELS = 10
MIN_LEVEL_S = 0.05  # a budget level is solved only with at least this much time
# a level's solver is given this share of its even part of the time left: solvers end a little
# past their limits (a 1,024-GPU level's heuristic: 0.35 s past 6 s) and the last level's
# overrun is the whole frontier's; an earlier level's unused part goes to the levels after it
LEVEL_SHARE = 0.9


@dataclass(frozen=True)
class FrontierPoint:
    rent_per_hour: float
    iteration_s: float
    cost_per_mtok: float
    plan: Any
    budget: float  # the budget per hour it was solved under
    proven: bool  # its T is the proven least T of any plan renting at most `rent_per_hour`
    bound_s: float | None  # proven lower bound on T at its budget (None: no proof)


@dataclass(frozen=True)
class LevelSolve:
    """One budget level solved: what the solver returned."""

    budget: float
    status: SolveStatus
    iteration_s: float | None
    rent_per_hour: float | None
    bound_s: float | None
    wall_s: float


@dataclass
class Frontier:
    solver: str
    exact: bool  # the ε-constraint method over every rent level (else heuristic budget levels)
    points: list[FrontierPoint] = field(default_factory=list)
    solves: list[LevelSolve] = field(default_factory=list)
    complete: bool = False  # the whole range of rents was covered
    levels_asked: int = 0  # heuristic: the budget levels asked for (the time may solve fewer)
    cost_bound_per_mtok: float | None = None
    message: str = ""
    wall_s: float = 0.0

    @property
    def proven(self) -> bool:
        """Every point proven and nothing left out: the exact frontier."""
        return self.exact and self.complete and all(p.proven for p in self.points)

    def proof_phrase(self, short: bool = False) -> str:
        """How far the frontier is proven, for its table's summary and its picture's title: a
        heuristic's point is proven where its solve proved it (a small sub-problem solved
        exactly), which a flat "no point is proven" had denied beside a row marked proven."""
        if self.proven:
            return "exact: every point proven" + ("" if short else ", the frontier complete")
        if self.exact:
            return "exact method, " + ("not every point proven (time limit)" if short else
                                       "but not every point proven in the time limit")
        proven = sum(p.proven for p in self.points)
        which = "no point" if not proven else f"{proven} of {plural(len(self.points), 'point')}"
        if short:
            return f"heuristic: {which} proven"
        return f"heuristic over {plural(len(self.solves), 'budget level')}: {which} proven, the frontier itself not"

    def cut_short(self) -> str:
        """What the time limit left out, in words ('' when nothing): the heuristic's levels not
        solved (they are solved spread over the range, so the rest lie between points), or the
        rents below where the exact descent stopped."""
        if not self.exact and len(self.solves) < self.levels_asked:
            return (f"the time limit solved {len(self.solves)} of {self.levels_asked} budget levels, spread over "
                    "the range of rents: raise it (-t) or ask fewer levels for the others")
        if self.exact and not self.complete and self.solves and self.solves[-1].iteration_s is not None:
            return (f"the time limit stopped the descent at rent ≤ {self.solves[-1].budget:,.2f}/h: plans that "
                    "rent less were not examined")
        return ""

    @property
    def status_when_empty(self) -> SolveStatus:
        # complete with no solve: no rent level holds the model states (exact levels), a proof too;
        # otherwise every level must be proven infeasible (the last one alone was read: a heuristic's
        # cheapest level, truly infeasible, turned its "unknown" levels above into a proof)
        proved = self.complete and all(s.status == SolveStatus.infeasible for s in self.solves)
        return SolveStatus.infeasible if proved else SolveStatus.unknown


BudgetedFn = Callable[[Problem, SolverOptions], SolveResult]


def at_budget(problem: Problem, budget: float) -> Problem:
    """The problem with objective time under `budget` per hour."""
    return problem.model_copy(update={"objective": Objective.time, "budget_per_hour": float(budget)})


# called before each level is solved: (its budget per hour, levels solved so far, levels left — for the
# exact descent at most that many: a point found drops every level above its rent)
LevelStart = Callable[[float, int, int], None]


def frontier(problem: Problem, solve: BudgetedFn, *, exact: bool, time_limit_s: float,
             options: SolverOptions | None = None, levels: int = DEFAULT_LEVELS,
             on_level: LevelStart | None = None) -> Frontier:
    """The frontier of `problem` (under its budget, if any) by `solve` (module text)."""
    start = time.perf_counter()
    options = options or SolverOptions(time_limit_s=time_limit_s)
    deadline = start + time_limit_s
    solve = getattr(solve, "budgeted", solve)  # a registry solver's budgeted solve: the descent breaks ties
    rents = _exact_levels(problem) if exact else None
    front = Frontier(solver="", exact=rents is not None)
    if rents is not None:
        _descend(problem, solve, rents, front, options, deadline, on_level)
        if not rents:
            front.message = "no machine set within the budget can hold the model states"
    else:
        _sweep(problem, solve, budget_levels(problem, levels), front, options, deadline, on_level)
    front.points = pareto(front.points)
    front.cost_bound_per_mtok = cost_bound(problem, front, rents) if front.exact else None
    front.wall_s = time.perf_counter() - start
    return front


def _exact_levels(problem: Problem) -> list[float] | None:
    try:
        return rental.rent_levels(problem, problem.budget_per_hour)
    except ValueError:  # too many machine sets to list: the heuristic levels instead
        return None


def _solve_level(problem: Problem, solve: BudgetedFn, budget: float, options: SolverOptions, share: float,
                 front: Frontier) -> SolveResult:
    """One budget level solved and recorded; its plan (if any) becomes a point."""
    result = solve(at_budget(problem, budget), options.model_copy(update={"time_limit_s": share, "hint": None}))
    front.solver = front.solver or result.solver
    t = rent = None
    if result.plan is not None:
        t, rent = iteration_time(problem, result.plan), rent_per_hour(problem, result.plan)
        proven = result.status == SolveStatus.optimal
        front.points.append(FrontierPoint(rent_per_hour=rent, iteration_s=t, cost_per_mtok=cost_of(problem, rent, t),
                                          plan=result.plan, budget=budget, proven=proven,
                                          bound_s=t if proven else result.bound_s))
    bound = result.bound_s if result.plan is not None or result.status != SolveStatus.infeasible else math.inf
    front.solves.append(LevelSolve(budget=budget, status=result.status, iteration_s=t, rent_per_hour=rent,
                                   bound_s=bound, wall_s=result.wall_s))
    if not front.message and result.plan is None:
        front.message = result.message
    return result


def _descend(problem: Problem, solve: BudgetedFn, rents: list[float], front: Frontier,
             options: SolverOptions, deadline: float, on_level: LevelStart | None = None) -> None:
    """The ε-constraint method from the top rent level down (module text)."""
    todo = list(rents)
    while todo:
        left = deadline - time.perf_counter()
        if left < MIN_LEVEL_S:
            return
        if on_level:
            on_level(todo[-1], len(front.solves), len(todo))
        result = _solve_level(problem, solve, todo[-1], options, LEVEL_SHARE * left / min(len(todo), 3), front)
        if result.plan is None:
            front.complete = result.status == SolveStatus.infeasible
            return
        rent = front.points[-1].rent_per_hour
        todo = [r for r in todo if r < cheaper_than(rent)]
    front.complete = True


def budget_levels(problem: Problem, count: int) -> list[float]:
    """`count` budgets spaced geometrically from the cheapest rent that can hold the model states to
    the whole cluster's rent (or the problem's budget), highest first; [] when none can hold them."""
    low = rental.least_rent_holding_states(problem)
    high = rental.rent_of(problem, rental.all_machines(problem))
    if problem.budget_per_hour is not None:
        high = min(high, problem.budget_per_hour)
    if low is None or low > spendable(high):
        return []
    if count <= 1 or high <= low:
        return [high]
    if low > 0:
        return [float(x) for x in np.geomspace(high, low, count)]
    # free machines hold the states: rent 0 is the last level, the others down to the least positive rent
    rents = problem.cluster.machine_rent
    least = float(min(rents[rents > 0], default=high))
    return [float(x) for x in np.geomspace(high, min(least, high), count - 1)] + [0.0]


def _sweep(problem: Problem, solve: BudgetedFn, budgets: list[float], front: Frontier,
           options: SolverOptions, deadline: float, on_level: LevelStart | None = None) -> None:
    """Each budget level solved with an equal share of the time left, in `spread` order: where
    the time runs out the levels solved still span the range (from the top down, 1,000 levels in
    10 s had reached the 124th, and the cheapest point shown was 41 % dearer per token)."""
    front.levels_asked = len(budgets)
    for i, k in enumerate(spread(len(budgets))):
        left = deadline - time.perf_counter()
        if left < MIN_LEVEL_S:
            return
        if on_level:
            on_level(budgets[k], i, len(budgets) - i)
        _solve_level(problem, solve, budgets[k], options, LEVEL_SHARE * left / (len(budgets) - i), front)
    front.complete = bool(budgets)
    if not budgets:
        front.message = "no machine set within the budget can hold the model states"


def spread(count: int) -> list[int]:
    """0 … count − 1 in an order whose every prefix spans the range: both ends, then the middle
    of each gap, widest gaps first."""
    if count <= 2:
        return list(range(count))
    order, gaps = [0, count - 1], [(0, count - 1)]
    while gaps:
        widest = []
        for lo, hi in gaps:
            if hi - lo > 1:
                mid = (lo + hi) // 2
                order.append(mid)
                widest += [(lo, mid), (mid, hi)]
        gaps = widest
    return order


def pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other point dominates (at most as dear and at most as slow, one strictly
    better; T within TIE is one T), by rent ascending. Of ties, the first found is kept."""
    kept: list[FrontierPoint] = []
    for p in sorted(points, key=lambda p: (p.rent_per_hour, p.iteration_s)):
        if kept and p.iteration_s >= kept[-1].iteration_s * (1 - TIE):
            continue  # dearer (or as dear) and not faster
        kept.append(p)
    return kept


def least_time(problem: Problem, budget: float) -> float:
    """A lower bound on T of any plan renting at most `budget`: every micro-batch computed by the
    most compute the budget buys at once (Tables.trivial_bound, on the affordable machines)."""
    flops = rental.most_compute_within(problem, budget)
    if flops <= 0:
        return math.inf
    whole = StageShape(tp=1, layers=problem.model.layers, last=1, flops=flops, attention_flops=flops)
    return problem.training.micro_batches * float(cost.stage_compute_time(problem.model, problem.training, whole))


def cost_bound(problem: Problem, front: Frontier, rents: list[float]) -> float | None:
    """A proven lower bound on the cost per million tokens of any plan (module text)."""
    solved = sorted(front.solves, key=lambda s: -s.budget)
    if not solved:
        return None
    best = math.inf
    for i, s in enumerate(solved):
        below = solved[i + 1].budget if i + 1 < len(solved) else -math.inf
        span = [r for r in rents if spendable(below) < r <= spendable(s.budget)]
        if not span:
            continue
        lower = max(s.bound_s or 0.0, least_time(problem, s.budget))
        best = min(best, cost_of(problem, span[0], lower) if math.isfinite(lower) else math.inf)
    if not front.complete:  # rents below the last level solved: the trivial bound only
        rest = [r for r in rents if r < cheaper_than(solved[-1].budget)]
        best = min([best] + [cost_of(problem, r, least_time(problem, r)) for r in rest])
    return None if not math.isfinite(best) else best
