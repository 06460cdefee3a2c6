"""`hexiscale frontier PROBLEM`: the Pareto-optimal plans by (rent per hour, T) — which machines to
rent for what speed (docs/prices.md §13) — as a table with the cost per million tokens, a picture
with `-o DIR` (frontier.png, and each point's plan as frontier-K.json), and with `--json` the
rows {rent_per_hour, iteration_s, cost_per_mtok, plan}.

Exact on small clusters (CP-SAT over every rent level it needs: each point proven), the
heuristic's budget levels on large ones; `--time-limit` bounds the whole command (loading,
solving, the picture, the output).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import typer
from rich import box
from rich.table import Table

from hexiscale.cli.app import (EXIT_INFEASIBLE, app, console, err_console, fail, friendly_errors, progress_line,
                               seed_option, time_limit_option, writable_folder, writing)
from hexiscale.cli.budget import MIN_SOLVE_S, CommandBudget
from hexiscale.cli.paths import file_read, same_file
from hexiscale.cli.views import plain
from planner.base import format_seconds, plural
from planner.io import load_problem, save_plan
from planner.prices import rented_machines
from planner.problem import Problem
from solvers import frontier as frontiers
from solvers.choose import AUTO_KIND, choose_kind
from solvers.common import SolverOptions
from solvers.kinds import solver_kind
from solvers.registry import EXACT_SOLVERS, SOLVERS_BY_KIND, get, solvers_listed, solvers_of

EXACT_FRONTIER_DEVICES = 8  # clusters up to this many devices get the exact frontier by default
AUTO_SOLVER = "auto"
# drawing and saving frontier.png once matplotlib is imported (-o imports it before the solve, where
# the budget counts it: 0.3-0.6 s on 2 shared cores): 0.15-0.26 s measured. Held back in full, not
# within the budget's 20 % share for the output: `frontier -o -t 3` ended at 3.3 s when it was
MATPLOTLIB_IMPORTED_PICTURE_S = 0.3
# what a frontier writes into its -o folder: the picture and each point's plan, frontier-K.json
FRONTIER_FILES = re.compile(r"frontier(?:-(\d+)\.json|\.png)")


@app.command()
@friendly_errors
def frontier(
    problem: str = typer.Argument(..., help="problem file or bundled name (a cluster with prices)"),
    out: Path = typer.Option(None, "--out", "-o", help="folder for frontier.png and each point's plan"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON instead of a table"),
    levels: int = typer.Option(frontiers.DEFAULT_LEVELS, "--levels", min=1,
                               help="budget levels of the heuristic frontier (the exact one solves every rent "
                                    "level it needs)"),
    time_limit: float = time_limit_option("wall-clock budget of the whole command, s"),
    solver: str = typer.Option(AUTO_SOLVER, "--solver", "-s",
                               help=f"auto (cpsat up to {EXACT_FRONTIER_DEVICES} devices, else heuristic) or a "
                                    f"registered solver ({solvers_listed()})"),
    kind: str = typer.Option(AUTO_KIND, "--kind", help="plan kind: auto (by sequence length), "
                             + ", ".join(SOLVERS_BY_KIND)),
    threads: int = typer.Option(2, "--threads", min=1, help="worker threads"),
    seed: int = seed_option(),
) -> None:
    """List the Pareto-optimal plans by rent per hour and iteration time.

    Each comes with its cost per million tokens: no other plan is at most as
    dear and at most as slow, and better in one."""
    budget = CommandBudget(time_limit)
    writable_folder(out, "--out")
    refuse_reading_an_output(problem, out)
    if out is not None:
        import hexiscale.viz.frontier  # noqa: F401 - matplotlib's import, counted before the solver's share
    prob = load_problem(problem)
    _check_priced(prob, problem)
    name, plan_kind = _solver_and_kind(prob, solver, kind)
    options = SolverOptions(time_limit_s=1.0, threads=threads, seed=seed)
    exact = name in EXACT_SOLVERS
    with err_console.status("") as status:  # stderr: stdout may carry JSON
        def on_level(rent: float, done: int, left: int) -> None:
            count = f"{done + left}" if not exact else f"at most {done + left}"
            progress_line(status, f"{prob.name}: level {done + 1} of {count} (rent ≤ {rent:.2f}/h) by {name} … "
                                  f"{budget.elapsed():.0f} s of {budget.limit_s:g} s")

        front = frontiers.frontier(prob, get(name, plan_kind), exact=exact, levels=levels, options=options,
                                   time_limit_s=_solver_limit(budget, prob, levels, out is not None),
                                   on_level=on_level)
    if not front.points:
        fail(f"no plan on the frontier ({front.status_when_empty.value}): "
             f"{front.message or 'no plan found in the time limit'}", code=EXIT_INFEASIBLE)
    labels = [rented_gpus(prob, p.plan) for p in front.points]
    if out is not None:
        _write(prob, front, labels, out)
    if as_json:
        console.print_json(json.dumps(rows(front)))
        return
    console.print(frontier_table(prob, front, labels))
    console.print(_summary(front), highlight=False, markup=False)


def _solver_limit(budget: CommandBudget, problem: Problem, levels: int, picture: bool) -> float:
    """The frontier's share of the limit: what is left less the plans' output and the picture."""
    solving = budget.for_solver(problem.cluster.num_devices, explain=False, plans=levels)
    return max(MIN_SOLVE_S, solving - MATPLOTLIB_IMPORTED_PICTURE_S * picture)


def _check_priced(problem: Problem, source: str) -> None:
    missing = problem.cluster.unpriced_machine()
    if missing is not None:
        machine = problem.cluster.machines[missing]
        fail(f"{source}: the frontier needs a price on every machine: cluster.machines[{missing}].price_per_hour "
             f"({machine.name}) is missing, and so is price_per_hour of its GPU type {machine.gpu}")


def _solver_and_kind(problem: Problem, solver: str, kind: str) -> tuple[str, str]:
    """The solver (auto: exact on small clusters) and the plan kind to solve in."""
    if kind != AUTO_KIND and kind not in SOLVERS_BY_KIND:
        fail(f"--kind: unknown plan kind {kind!r}; available: {AUTO_KIND}, {', '.join(SOLVERS_BY_KIND)}")
    auto = solver == AUTO_SOLVER
    plan_kind, _ = choose_kind(problem, kind, None if auto else solver)
    if auto:  # exact where the cluster is small and the kind's exact models take the problem
        small = problem.cluster.num_devices <= EXACT_FRONTIER_DEVICES
        solver = "cpsat" if small and solver_kind(plan_kind).exact_refusal(problem) is None else "heuristic"
    if solver not in solvers_of(plan_kind):
        fail(f"--solver: unknown solver {solver!r} for {plan_kind} plans; available: "
             f"{AUTO_SOLVER}, {', '.join(solvers_of(plan_kind))}")
    return solver, plan_kind


def rented_gpus(problem: Problem, plan) -> str:
    """The GPUs a plan rents, by type: '8×H100 + 16×RTX4090' (whole machines)."""
    cluster = problem.cluster
    counts = Counter()
    for m in rented_machines(problem, plan.devices):
        counts[cluster.machines[m].gpu] += cluster.machines[m].count
    return " + ".join(f"{n}×{gpu}" for gpu, n in sorted(counts.items(), key=lambda x: -x[1]))


def rows(front) -> list[dict]:
    """The JSON rows of docs/prices.md §13 (and whether each point is proven)."""
    return [{"rent_per_hour": p.rent_per_hour, "iteration_s": p.iteration_s, "cost_per_mtok": p.cost_per_mtok,
             "proven": p.proven, "plan": json.loads(p.plan.to_json())} for p in front.points]


def frontier_table(problem: Problem, front, labels: list[str]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=f"{plain(problem.name)}: time–rent frontier")
    for header in ("rent/h", "T", "tokens/s", "per Mtok", "rents", "proof"):
        table.add_column(header, justify="right" if header not in ("rents", "proof") else "left")
    tokens = problem.training.global_batch * problem.training.seq_len
    cheapest = min(front.points, key=lambda p: (p.cost_per_mtok, p.iteration_s))
    for p, label in zip(front.points, labels):
        mark = " ★" if p is cheapest else ""
        proof = "proven" if p.proven else (f"bound {format_seconds(p.bound_s)}" if p.bound_s is not None else "—")
        table.add_row(f"{p.rent_per_hour:,.2f}", format_seconds(p.iteration_s), f"{tokens / p.iteration_s:,.0f}",
                      f"{p.cost_per_mtok:.4g}{mark}", plain(label), proof)
    return table


def _summary(front) -> str:
    how = front.proof_phrase()
    bound = (f"; least cost per Mtok ≥ {front.cost_bound_per_mtok:.4g} (proven)"
             if front.cost_bound_per_mtok is not None else "")
    short = front.cut_short()
    return f"{plural(len(front.points), 'plan')} on the frontier ({how}), ★ cheapest per token{bound}; " \
           f"solved by {front.solver} in {front.wall_s:.1f} s" + (f"\nnote: {short}" if short else "")


def _write(problem: Problem, front, labels: list[str], out: Path) -> None:
    from hexiscale.viz.frontier import draw_frontier  # matplotlib only when drawing

    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
        remove_earlier_plans(out, len(front.points))
        path = draw_frontier(problem, front, labels, out)
        for i, p in enumerate(front.points, start=1):
            save_plan(p.plan, out / f"frontier-{i}.json")
    err_console.print(f"wrote {path} and {plural(len(front.points), 'plan')} (frontier-K.json)", highlight=False,
                      markup=False)


def refuse_reading_an_output(problem: str, out: Path | None) -> None:
    """The problem file is not one of the files -o writes or removes (frontier-K.json, frontier.png)."""
    read = file_read(problem)
    if out is not None and read is not None and FRONTIER_FILES.fullmatch(read.name) and same_file(read.parent, out):
        fail(f"--out: {problem}, the problem file read, is in {out} under a name the frontier writes or removes "
             f"there (frontier.png, frontier-K.json): write the frontier to another folder")


def remove_earlier_plans(out: Path, points: int) -> None:
    """Remove the plans of an earlier frontier that this one does not write over (frontier-K.json
    past its `points`), said in one line: a 2-point frontier left the earlier one's frontier-3.json
    beside its own, to be taken for a point of this problem's. Anything else there stays."""
    numbered = ((p, FRONTIER_FILES.fullmatch(p.name)) for p in out.iterdir() if p.is_file())
    stale = sorted((int(m[1]), p) for p, m in numbered if m and m[1] and not 1 <= int(m[1]) <= points)
    for _, path in stale:
        path.unlink()
    if stale:
        names = ", ".join(p.name for _, p in stale)
        err_console.print(f"note: removed from {out} an earlier frontier's plans that this one "
                          f"({plural(points, 'plan')}) does not write: {names}", highlight=False, markup=False,
                          soft_wrap=True)
