"""How every solver honours the problem's objective (docs/prices.md §13): T, T under a budget
per hour, or the cost per token.

`honouring(fn, exact=...)` wraps a registered solver (`solvers.registry.get` wraps every one):
- objective `time` without a budget: the solver itself;
- a budget: the solver's own budget when it has one (a function marked `honours_budget`: the
  layered exact models, whose rented_M binaries carry it; but on each maximal affordable set
  when there are at most FEW_SETS, where smaller models prove more), else the solver on machine sets
  (`solvers.rental`): the whole cluster when it fits the budget, else each maximal affordable
  set — every one of them, up to interchangeable machines, for an exact solver or a small
  cluster (so the optimum and the bound are proven), else the heuristic's candidate sets (most
  compute first, then other mixes of GPU types) — with the time shared out, and the best plan
  kept, written back in the cluster's ids;
- `cost`: the time–rent frontier under the (optional) budget (`solvers.frontier`), exact for an
  exact solver, and its cheapest point per token.
A function marked `honours_objective` (e.g. brute force with objectives) is left as it is.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Callable

from planner.kinds import iteration_time
from planner.prices import cheaper_than, cost_of, rent_per_hour
from planner.problem import Objective, Problem
from planner.solver_info import SolverInfo, SolveStatus
from solvers import frontier as frontiers
from solvers import rental
from solvers.common import SolveResult, SolverOptions

SolverFn = Callable[[Problem, SolverOptions], SolveResult]
EXACT_SETS = 8  # a heuristic solves every maximal affordable set when there are at most this many
CANDIDATE_SETS = 4  # else this many candidate sets
FEW_SETS = 4  # a solver with its own budget solves each maximal set when there are at most this many
MIN_SET_S = 0.05  # a machine set is solved only with at least this much time


def honouring(fn: SolverFn, *, exact: bool) -> SolverFn:
    """`fn` made to honour the problem's objective and budget (see the module text)."""
    if getattr(fn, "honours_objective", False):
        return fn
    native = getattr(fn, "honours_budget", False)
    budgeted = functools.partial(native_or_sets if native else within_budget, fn, exact=exact)

    @functools.wraps(fn)
    def solve(problem: Problem, options: SolverOptions) -> SolveResult:
        if problem.objective == Objective.cost:
            return cheapest(problem, options, budgeted, exact=exact)
        deadline = time.perf_counter() + options.time_limit_s
        result = fn(problem, options) if problem.budget_per_hour is None else budgeted(problem, options)
        if exact and problem.cluster.priced:
            return least_rent_of_ties(problem, options, budgeted, result, deadline)
        return result

    solve.honours_objective = True
    solve.budgeted = budgeted  # T under a budget alone (no tie-break): what the frontier solves per level
    return solve


def within_budget(fn: SolverFn, problem: Problem, options: SolverOptions, *, exact: bool) -> SolveResult:
    """The least T within `problem.budget_per_hour` by `fn` on machine sets (module text)."""
    start, budget = time.perf_counter(), problem.budget_per_hour
    if rental.affords_everything(problem, budget):
        result = fn(rental.restricted(problem, rental.all_machines(problem))[0], options)
        return result if result.plan is None else result.model_copy(update={"plan": result.plan.model_copy(
            update={"problem": problem.name})})
    sets, complete = machine_sets(problem, budget, exact)
    if not sets:
        return _nothing_fits(problem, fn, start, proven=complete)
    deadline = start + options.time_limit_s
    outcomes = []
    for i, machines in enumerate(sets):
        share = (deadline - time.perf_counter()) / (len(sets) - i)
        if share < MIN_SET_S and outcomes:
            complete = False
            break
        outcomes.append(solve_on_set(fn, problem, options, machines, max(share, MIN_SET_S)))
    return _best_of(problem, outcomes, complete=complete and len(outcomes) == len(sets),
                    wall=time.perf_counter() - start, sets=len(sets))


def least_rent_of_ties(problem: Problem, options: SolverOptions, budgeted: SolverFn, result: SolveResult,
                       deadline: float) -> SolveResult:
    """Of the plans with the proven least T, one that rents least (an exact solver's answer on a
    priced cluster): the next rent level below the plan's is solved while its least T ties, in
    the time left; the result keeps the status and bound of the first solve."""
    try:
        levels = rental.rent_levels(problem, problem.budget_per_hour)
    except ValueError:  # too many machine sets to list: the first answer stands
        return result
    while result.status == SolveStatus.optimal and time.perf_counter() < deadline - MIN_SET_S:
        rent = rent_per_hour(problem, result.plan)
        lower = [r for r in levels if r < cheaper_than(rent)]
        if not lower:
            break
        tighter = problem.model_copy(update={"budget_per_hour": lower[-1]})
        left = options.model_copy(update={"time_limit_s": deadline - time.perf_counter(), "hint": None})
        tie = budgeted(tighter, left)
        if tie.status != SolveStatus.optimal or tie.objective_s > result.objective_s * (1 + frontiers.TIE):
            break
        plan = tie.plan.model_copy(update={"problem": problem.name, "solver": result.plan.solver})
        result = result.model_copy(update={"plan": plan, "objective_s": tie.objective_s})
    return result


def native_or_sets(fn: SolverFn, problem: Problem, options: SolverOptions, *, exact: bool) -> SolveResult:
    """A solver that carries the budget itself, on the whole problem — unless the budget leaves at
    most FEW_SETS maximal machine sets: then on each of them (smaller models prove more: their
    trivial and combinatorial bounds count only the set's devices)."""
    try:
        sets = rental.maximal_sets(problem, problem.budget_per_hour)
    except ValueError:  # too many to list
        sets = None
    everything = rental.affords_everything(problem, problem.budget_per_hour)
    if sets is None or everything or len(sets) > FEW_SETS:
        return fn(problem, options)
    return within_budget(fn, problem, options, exact=exact)


def machine_sets(problem: Problem, budget: float, exact: bool) -> tuple[list[tuple[int, ...]], bool]:
    """The machine sets to solve under `budget`, and whether they are every maximal affordable
    one (then the best of their optima is the optimum)."""
    try:  # sets alike up to machine names have the same optimum: one of each is solved
        every = rental.distinct_sets(problem, rental.maximal_sets(problem, budget))
    except ValueError:  # too many to list: a large cluster
        every = None
    if every is not None and (exact or len(every) <= EXACT_SETS):
        return every, True
    return rental.candidate_sets(problem, budget, CANDIDATE_SETS), False


def solve_on_set(fn: SolverFn, problem: Problem, options: SolverOptions, machines, share: float):
    """`fn` on the problem restricted to `machines`; its plan in the whole problem's ids."""
    smaller, new_to_old = rental.restricted(problem, machines)
    result = fn(smaller, options.model_copy(update={"time_limit_s": share, "hint": None}))
    if result.plan is not None:
        result = result.model_copy(update={"plan": rental.lifted(result.plan, problem, new_to_old)})
    return machines, result


def _best_of(problem: Problem, outcomes: list, *, complete: bool, wall: float, sets: int) -> SolveResult:
    """The best plan of the sets solved: `optimal` when every maximal set was solved to
    optimality (or proven to have no plan); the bound the least of theirs when every set has one."""
    found = [(r.objective_s, i) for i, (_, r) in enumerate(outcomes) if r.plan is not None]
    proven = complete and all(r.status in (SolveStatus.optimal, SolveStatus.infeasible) for _, r in outcomes)
    bounds = [_set_bound(r) for _, r in outcomes]
    bound = min(bounds) if complete and None not in bounds else None
    name = outcomes[0][1].solver
    what = (f"every maximal machine set within the budget ({sets})" if complete
            else f"{len(outcomes)} of the candidate machine sets within the budget")
    if not found:
        status = SolveStatus.infeasible if proven else SolveStatus.unknown
        return SolveResult(solver=name, status=status, wall_s=wall, message=(
            f"no plan within the budget of {problem.budget_per_hour:g} per hour: solved on {what}"
            + ("" if proven else "; that is no proof that none exists")))
    t, i = _least(problem, outcomes, found)
    machines, best = outcomes[i]
    status = SolveStatus.optimal if proven else SolveStatus.feasible
    bound = None if bound is None else min(bound, t)
    plan = best.plan.model_copy(update={"solver": SolverInfo(name=name, status=status, objective_s=t,
                                                              bound_s=bound, wall_s=wall)})
    note = f"best of {what}: rents {len(rental.rented_of(problem, plan))}/{len(problem.cluster.machines)} machines"
    return best.model_copy(update={"status": status, "plan": plan, "objective_s": t, "bound_s": bound,
                                   "wall_s": wall, "message": "; ".join(filter(None, [best.message, note]))})


def _least(problem: Problem, outcomes: list, found: list[tuple[float, int]]) -> tuple[float, int]:
    """The least T found, and of the sets that tie in it (within frontiers.TIE) the one of least
    rent, then least cost per token, as the exact solvers break ties (`least_rent_of_ties`): by
    index, a dearer set of equal T won, and the frontier and objective cost priced its rent."""
    least = min(t for t, _ in found)
    ties = [(t, i) for t, i in found if t <= least * (1 + frontiers.TIE)]
    if not problem.cluster.priced:
        return min(ties)

    def dearness(pair: tuple[float, int]) -> tuple[float, float, int]:
        rent = rent_per_hour(problem, outcomes[pair[1]][1].plan)
        return rent, cost_of(problem, rent, pair[0]), pair[1]
    return min(ties, key=dearness)


def _set_bound(result: SolveResult) -> float | None:
    if result.status == SolveStatus.infeasible and result.plan is None:
        return math.inf
    return result.bound_s


def _nothing_fits(problem: Problem, fn: SolverFn, start: float, *, proven: bool) -> SolveResult:
    """No machine set within the budget can hold the model states: infeasible when every set was
    listed (a proof), else unknown."""
    least = rental.least_rent_holding_states(problem)
    need = "" if least is None else f"; the cheapest machine set found that can hold them rents {least:g} per hour"
    return SolveResult(solver=getattr(fn, "__name__", "solver"),  # solvers.choose names it as registered
                       status=SolveStatus.infeasible if proven else SolveStatus.unknown,
                       wall_s=time.perf_counter() - start,
                       message=f"no plan within the budget of {problem.budget_per_hour:g} per hour: no machine "
                               f"set it rents {'has' if proven else 'was found with'} the memory for the model "
                               f"states{need}")


def cheapest(problem: Problem, options: SolverOptions, budgeted: SolverFn, *, exact: bool) -> SolveResult:
    """The least cost per token: the cheapest point of the frontier under the budget (exact for an
    exact solver: then `optimal`, with the proven least cost, when every point is proven)."""
    start = time.perf_counter()
    front = frontiers.frontier(problem, budgeted, exact=exact, time_limit_s=options.time_limit_s,
                               options=options)
    if not front.points:
        return SolveResult(solver=front.solver, status=front.status_when_empty, wall_s=time.perf_counter() - start,
                           message=front.message or "no plan found")
    point = min(front.points, key=lambda p: (p.cost_per_mtok, p.iteration_s))
    status = SolveStatus.optimal if front.proven else SolveStatus.feasible
    bound = front.cost_bound_per_mtok
    wall = time.perf_counter() - start
    plan = point.plan.model_copy(update={"solver": SolverInfo(name=front.solver, status=status,
                                                               objective_s=point.iteration_s, wall_s=wall)})
    short = front.cut_short()
    note = (f"the cheapest per token of {len(front.points)} frontier point(s)"
            + (f"; proven least cost {bound:.6g} per million tokens" if status == SolveStatus.optimal
               else f"; cost bound {bound:.6g} per million tokens" if bound is not None else "")
            + (f"; {short}" if short else ""))
    return SolveResult(solver=front.solver, status=status, plan=plan, objective_s=point.iteration_s,
                       wall_s=wall, message=note, cost_bound_per_mtok=bound)


def plan_cost(problem: Problem, plan) -> float:
    """The cost per million tokens of a plan (priced by the planner)."""
    return cost_of(problem, rent_per_hour(problem, plan), iteration_time(problem, plan))

