"""What a plan costs, for the terminal (docs/prices.md §13): its rent per hour and cost per million
tokens as rows of a summary table, and which machines it rents. Every function returns nothing
(no rows, no table) when the cluster has no prices, so that unpriced problems print as before."""

from __future__ import annotations

from typing import Any

import numpy as np

from rich import box
from rich.table import Table

from planner.base import plural
from planner.prices import fits_budget, rented_machines
from hexiscale.cli.views import plain
from planner.problem import Objective, Problem

MAX_MACHINE_ROWS = 32  # rented machines listed one per row; more are grouped by GPU type


def money(x: float) -> str:
    """$12.34 (or $0.0123 below a cent, so that a cost per million tokens never reads $0.00)."""
    return f"${x:,.2f}" if abs(x) >= 0.01 or x == 0 else f"${x:.3g}"


def cost_text(x: float) -> str:
    """A cost per million tokens to 4 significant digits: $0.1902 (costs differ in the 3rd digit)."""
    return f"${x:,.4g}" if x < 1000 else f"${x:,.0f}"


def rent_line(problem: Problem, devices, rent: float) -> str:
    """'$24.24/h: 2 of 12 machines (16 of 96 GPUs)' (and the budget, when the problem has one)."""
    rented = rented_machines(problem, devices)
    gpus = int(problem.cluster.machine_counts[list(rented)].sum())
    line = (f"{money(rent)}/h: {len(rented)} of {plural(len(problem.cluster.machines), 'machine')} "
            f"({gpus:,} of {problem.cluster.num_devices:,} GPUs)")
    budget = problem.budget_per_hour
    if budget is not None:
        line += f", {'within' if fits_budget(problem, rent) else 'OVER'} the budget of {money(budget)}/h"
    return line


def partial_prices(cluster) -> str:
    """Where some machines have a price and others none: the first unpriced one, and that no rent
    is shown (a rent that left it out would be wrong, not cheap); '' otherwise."""
    missing = cluster.unpriced_machine()
    if missing is None or np.isnan(cluster.machine_prices).all():
        return ""  # every machine priced, or none
    machine = cluster.machines[missing]
    return (f"no rent: cluster.machines[{missing}].price_per_hour ({plain(machine.name)}) is missing, and so is "
            f"price_per_hour of its GPU type {plain(machine.gpu)}; rent and cost are shown when every machine "
            "has a price")


def price_rows(problem: Problem, devices, estimate: Any) -> list[tuple[str, str]]:
    """('rent', ...) and ('cost', ...) rows for a summary table; [] without prices (one row
    saying why where only some machines have one)."""
    if estimate.rent_per_hour is None:
        partial = partial_prices(problem.cluster)
        return [("rent", partial)] if partial else []
    chosen = "  (the objective)" if problem.objective == Objective.cost else ""
    return [("rent", rent_line(problem, devices, estimate.rent_per_hour)),
            ("cost", f"{cost_text(estimate.cost_per_mtok)} per million tokens{chosen}")]


def beyond_budget(problem: Problem, devices) -> list[str]:
    """The unrented machines that the problem's budget cannot add to the plan's rent (names; []
    without a budget)."""
    budget, cluster = problem.budget_per_hour, problem.cluster
    if budget is None or not cluster.priced:
        return []
    rented = set(rented_machines(problem, devices))
    spent = float(cluster.machine_rent[sorted(rented)].sum())
    return [m.name for i, m in enumerate(cluster.machines)
            if i not in rented and not fits_budget(problem, spent + float(cluster.machine_rent[i]))]


def rental_view(problem: Problem, devices) -> Table | None:
    """The machines a plan rents and leaves, with their rent per hour (None without prices)."""
    cluster = problem.cluster
    if not cluster.priced:
        return None
    rented = set(rented_machines(problem, devices))
    table = Table(title="machines rented (whole machines: every device of a rented machine is paid for)",
                  box=box.SIMPLE, title_justify="left")
    for col in ("machine", "GPUs", "$/GPU-h", "$/h", "rented"):
        table.add_column(col, justify="left" if col in ("machine", "rented") else "right")
    order = sorted(range(len(cluster.machines)), key=lambda m: (m not in rented, m))
    for m in order[:MAX_MACHINE_ROWS]:
        machine = cluster.machines[m]
        table.add_row(plain(machine.name), f"{machine.count}× {plain(machine.gpu)}",
                      money(float(cluster.machine_prices[m])),
                      money(float(cluster.machine_rent[m])), "rented" if m in rented else "[dim]not rented[/]")
    if len(order) > MAX_MACHINE_ROWS:
        left = order[MAX_MACHINE_ROWS:]
        table.add_row(f"… {plural(len(left), 'more machine')}", "", "", money(float(cluster.machine_rent[left].sum())),
                      f"{sum(m in rented for m in left)} rented")
    total = float(cluster.machine_rent[sorted(rented)].sum())
    table.add_row("[bold]rent[/]", "", "", f"[bold]{money(total)}[/]",
                  f"{len(rented)} of {plural(len(cluster.machines), 'machine')}")
    return table
