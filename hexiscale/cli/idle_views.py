"""Why a plan of either kind leaves devices idle, for the terminal: per idle machine the best
plan found that also uses them (`solvers.idle`; each kind's `explain_idle`), in the objective's
terms, and the machines a budget cannot rent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich import box
from rich.table import Table

from hexiscale.cli.price_views import beyond_budget, cost_text
from hexiscale.cli.views import plain
from planner.base import format_seconds, plural
from planner.prices import cost_per_mtok
from planner.problem import Objective, Problem
from solvers.idle import MAX_MACHINES, IdleMachine, idle_devices

Explain = Callable[[Problem, Any, float | None], list[IdleMachine]]  # (problem, plan, deadline) → reasons


def explained_idle(problem: Problem, plan: Any, est: Any, explain: Explain,
                   deadline: float | None = None) -> Table | None:
    """Why devices stay idle: per idle machine, the best plan found that also uses them (the
    plan kind's `explain`; as many machines as the deadline allows; the rest are counted)."""
    idle = idle_devices(problem, plan)
    if not idle:
        return None
    beyond = beyond_budget(problem, plan.devices)  # machines the budget cannot rent: no search needed
    reasons = [r for r in explain(problem, plan, deadline) if r.machine not in beyond]
    used = len(plan.devices)
    table = Table(title=f"{used:,}/{problem.cluster.num_devices:,} devices used; why the others are idle",
                  show_header=False, box=box.SIMPLE, title_justify="left")
    table.add_column()
    if beyond:
        table.add_row(f"{plain(', '.join(beyond))}: not rented, renting any of them would exceed the budget of "
                      f"${problem.budget_per_hour:,.2f}/h")
    for r in reasons:
        table.add_row(plain(_reason(problem, r, est)))
    more = len(idle) - len(reasons) - len(beyond)
    if more > 0:
        why = "the time limit" if len(reasons) < min(len(idle), MAX_MACHINES) else f"at most {MAX_MACHINES}"
        table.add_row(f"… and {plural(more, 'more machine')} with idle devices, not explained ({why})")
    return table


def _reason(problem: Problem, idle: IdleMachine, est: Any) -> str:
    """Why one machine idles, in the objective's terms: T (with or without a budget), or under
    objective cost the cost per million tokens of the best plan found that also uses it (its
    machines' rent is fixed, so the least T of those plans is their least cost too)."""
    if problem.objective != Objective.cost or idle.best_plan is None or est.cost_per_mtok is None:
        return idle.describe(est.iteration_s)
    cost = cost_per_mtok(problem, idle.best_plan, idle.best_time_s)
    return (f"{idle.machine} ({len(idle.devices)} idle): with them as {idle.added}, best {cost_text(cost)} "
            f"per million tokens vs {cost_text(est.cost_per_mtok)} ({(cost / est.cost_per_mtok - 1) * 100:+.1f} %; "
            f"T {format_seconds(idle.best_time_s)} vs {format_seconds(est.iteration_s)}): {idle.why}")
