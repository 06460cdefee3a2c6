"""What the brute-force oracles of both plan kinds share to honour the objective (docs/prices.md
§13): the best plan per rented machine set, and from those the answer of every objective and
the Pareto frontier.

Every plan rents exactly the machines it uses, so the least T of each *machine set* (over all
plans whose used devices lie on exactly those machines) is all an objective needs:
- time: the least T of any set; time under a budget: of any set whose rent fits the budget;
- cost: the least rent·T (the cost per token at the set's least T), under the budget if any;
- the frontier: the sets' (rent, least T) points that no other point dominates.
This shares no code with the exact solvers or `solvers.frontier` (it is their oracle); it reads
prices through the planner's own `Cluster.device_price` and budget test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import time

from planner.prices import cost_of, fits_budget
from planner.problem import Objective, Problem
from planner.solver_info import SolverInfo, SolveStatus
from solvers.common import SolveResult

# relative: two T (or two rents) this close are one figure (float rounding of sums)
TIE = 1e-9

MachineSet = tuple[int, ...]


@dataclass(frozen=True)
class BrutePoint:
    """One plan with its rent per hour, T and cost per million tokens (None without prices)."""

    machines: MachineSet
    rent_per_hour: float | None
    iteration_s: float
    cost_per_mtok: float | None
    plan: Any


class BestPerMachineSet:
    """The least-T plan (kept as the caller's own cheap item) of every machine set offered.
    The first plan offered wins a tie, so the answers do not depend on dictionary order."""

    def __init__(self) -> None:
        self.best: dict[MachineSet, tuple[float, Any]] = {}

    def offer(self, machines: MachineSet, t: float, item: Any) -> None:
        held = self.best.get(machines)
        if held is None or t < held[0]:
            self.best[machines] = (t, item)

    def points(self, problem: Problem, build: Callable[[Any], Any]) -> list[BrutePoint]:
        """Every set's best plan, priced; `build` turns an item into its plan."""
        out = []
        for machines, (t, item) in self.best.items():
            rent = set_rent(problem, machines)
            out.append(BrutePoint(machines, rent, t, cost_of(problem, rent, t), build(item)))
        return out


def set_rent(problem: Problem, machines: MachineSet) -> float | None:
    """Σ count·price of the machines (None when one of them has no price)."""
    cluster, total = problem.cluster, 0.0
    for m in machines:
        price = cluster.device_price(m)
        if price is None:
            return None
        total += cluster.machines[m].count * price
    return total


def affordable(problem: Problem, points: list[BrutePoint]) -> list[BrutePoint]:
    """The points within the problem's budget (all of them without one)."""
    return [p for p in points if fits_budget(problem, p.rent_per_hour)]


def choose(problem: Problem, points: list[BrutePoint]) -> BrutePoint | None:
    """The point the problem's objective picks among `points` (None: none fits the budget).
    Ties: the lower T for cost, the lower rent for time (then the first offered)."""
    fitting = affordable(problem, points)
    if not fitting:
        return None
    if problem.objective == Objective.cost:
        return min(fitting, key=lambda p: (p.cost_per_mtok, p.iteration_s))
    least = min(p.iteration_s for p in fitting)
    tied = [p for p in fitting if p.iteration_s <= least * (1 + TIE)]
    return min(tied, key=lambda p: (p.rent_per_hour if p.rent_per_hour is not None else 0.0))


def pareto(points: list[BrutePoint]) -> list[BrutePoint]:
    """The points no other dominates (at most as dear and at most as slow, strictly better in
    one; figures within TIE are equal), one per (rent, T), by rising rent."""
    ordered = sorted(points, key=lambda p: (p.rent_per_hour, p.iteration_s))
    out: list[BrutePoint] = []
    for p in ordered:
        if out and p.iteration_s >= out[-1].iteration_s * (1 - TIE):
            continue  # the last kept point is as cheap (or cheaper) and as fast
        if out and p.rent_per_hour <= out[-1].rent_per_hour * (1 + TIE):
            out.pop()  # the same rent, faster: it replaces the last point
        out.append(p)
    return out


def brute_frontier(problem: Problem, points: list[BrutePoint]) -> list[BrutePoint]:
    """The Pareto frontier of the plans within the problem's budget (docs/prices.md §13)."""
    if not problem.cluster.priced:
        raise ValueError(f"problem {problem.name!r}: the frontier needs a price on every machine")
    return pareto(affordable(problem, points))


def brute_result(problem: Problem, points: list[BrutePoint], start: float, no_plan: str) -> SolveResult:
    """Brute force's SolveResult: the objective's point, `optimal`; `infeasible` when no plan
    fits the budget (or, `no_plan` saying why, none fits at all). T is the bound only when T is
    what is minimized."""
    best, wall = choose(problem, points), time.perf_counter() - start
    if best is None:
        why = (f"no plan within the budget of {problem.budget_per_hour:g} per hour (every plan enumerated)"
               if points else no_plan)
        return SolveResult(solver="brute", status=SolveStatus.infeasible, wall_s=wall, message=why)
    bound = best.iteration_s if problem.objective == Objective.time else None
    plan = best.plan.model_copy(update={"solver": SolverInfo(
        name="brute", status=SolveStatus.optimal, objective_s=best.iteration_s, bound_s=bound, wall_s=wall)})
    return SolveResult(solver="brute", status=SolveStatus.optimal, plan=plan, objective_s=best.iteration_s,
                       bound_s=bound, wall_s=wall)
