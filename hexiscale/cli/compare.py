"""`hexiscale compare`: every solver on the same problems, judged by the one evaluator.

Each solver's plan is re-checked with `planner.validate` and priced with `planner.evaluate`
(never with the solver's own figure), so the columns compare like with like: iteration time,
tokens/s, MFU, the gap to the best lower bound any exact solver proved, the speed-up over the
symmetric (Megatron-style) baseline, and the solve wall time.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import typer
from pydantic import Field
from rich import box
from rich.table import Table

from hexiscale.cli.app import app, console, err_console, fail, friendly_errors, writable_file, writable_folder
from planner.kinds import evaluate
from planner.base import Frozen
from planner.io import load_problem, save_plan
from planner.problem import Problem
from planner.kinds import validate
from solvers.common import SolveResult, SolverOptions
from solvers.registry import SOLVERS, solve

EXACT_SOLVERS = ("cpsat", "milp")
REFERENCE = "symmetric"
DEFAULT_SOLVERS = "heuristic,cpsat,milp,symmetric,symmetric-all,random"


class ComparisonRow(Frozen):
    problem: str
    solver: str
    status: str = Field(description="solver status, or skipped | error | invalid")
    iteration_s: float | None = Field(default=None, description="T by planner.evaluate")
    tokens_per_s: float | None = None
    mfu: float | None = None
    bound_s: float | None = Field(default=None, description="this solver's proven lower bound")
    gap: float | None = Field(default=None, description="(T − best bound of any solver) / T")
    speedup: float | None = Field(default=None, description="T_symmetric / T")
    wall_s: float | None = Field(default=None, description="solve wall time")
    devices_used: int | None = None
    pipelines: int | None = None
    message: str = ""


def run_solver(problem: Problem, name: str, options: SolverOptions, exact_max_devices: int) -> tuple[ComparisonRow, SolveResult | None]:
    """One solver on one problem, its plan judged by the evaluator; failures become rows."""
    base = dict(problem=problem.name, solver=name)
    if name in EXACT_SOLVERS and problem.cluster.num_devices > exact_max_devices:
        return ComparisonRow(**base, status="skipped", message=f"{problem.cluster.num_devices} devices > "
                             f"--exact-max-devices {exact_max_devices}"), None
    try:
        result = solve(problem, name, options)
    except Exception as exc:  # a crashing solver is a row of the table, not the end of the run
        return ComparisonRow(**base, status="error", message=f"{type(exc).__name__}: {exc}"), None
    row = dict(base, status=result.status.value, bound_s=result.bound_s, wall_s=result.wall_s,
               message=result.message)
    if result.plan is None:
        return ComparisonRow(**row), result
    violations = validate(problem, result.plan)
    if violations:
        return ComparisonRow(**dict(row, status="invalid", message=str(violations[0]))), result
    est = evaluate(problem, result.plan)
    return ComparisonRow(**row, iteration_s=est.iteration_s, tokens_per_s=est.tokens_per_s, mfu=est.mfu,
                         devices_used=len(result.plan.devices), pipelines=len(result.plan.pipelines)), result


def compare_problem(problem: Problem, solvers: list[str], options: SolverOptions, exact_max_devices: int = 32,
                    plans_dir: Path | None = None, on_start=None,
                    exact_options: SolverOptions | None = None) -> list[ComparisonRow]:
    """All solvers on one problem, with gap and speed-up filled in from the others' results.
    `exact_options` (default: `options`) is what cpsat and milp run with."""
    rows, reference = [], None
    for name in solvers:
        if on_start:
            on_start(problem.name, name)
        opts = exact_options if exact_options is not None and name in EXACT_SOLVERS else options
        row, result = run_solver(problem, name, opts, exact_max_devices)
        rows.append(row)
        if plans_dir is not None and result is not None and result.plan is not None:
            plans_dir.mkdir(parents=True, exist_ok=True)
            save_plan(result.plan, plans_dir / f"{problem.name}.{name}.json")
        if name == REFERENCE:
            reference = row
    if reference is None:  # the speed-up column needs the symmetric figure even if not asked for
        reference, _ = run_solver(problem, REFERENCE, options, exact_max_devices)
    bounds = [r.bound_s for r in rows if r.bound_s is not None]
    best_bound = max(bounds) if bounds else None  # the tightest proven lower bound
    return [_with_relative(r, best_bound, reference.iteration_s) for r in rows]


def _with_relative(row: ComparisonRow, best_bound: float | None, symmetric_s: float | None) -> ComparisonRow:
    if row.iteration_s is None:
        return row
    update = {}
    if best_bound is not None:
        update["gap"] = (row.iteration_s - best_bound) / row.iteration_s
    if symmetric_s is not None:
        update["speedup"] = symmetric_s / row.iteration_s
    return row.model_copy(update=update)


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "—" if x is None else format(x, spec) + suffix


def _kilo(x: float | None) -> str:
    return "—" if x is None else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


STATUS_STYLE = {"optimal": "green", "feasible": "cyan", "unknown": "yellow", "infeasible": "magenta",
                "skipped": "dim", "error": "red", "invalid": "red"}


def comparison_table(problem: Problem, rows: list[ComparisonRow]) -> Table:
    """One row per solver; each row's note goes in the caption so the numbers fit 80 columns."""
    best = min((r.iteration_s for r in rows if r.iteration_s is not None), default=None)
    notes = "\n".join(f"{r.solver}: {r.message}" for r in rows if r.message)
    table = Table(title=f"{problem.name}: {problem.model.name} on {problem.cluster.name} "
                        f"({problem.cluster.num_devices} GPUs)", box=box.SIMPLE_HEAD, header_style="bold",
                  caption=notes or None, caption_justify="left", padding=(0, 1), pad_edge=False,
                  collapse_padding=True, show_edge=False)
    table.add_column("solver", overflow="fold")  # the one column that may wrap on a narrow terminal
    table.add_column("status", no_wrap=True)
    for col, width in (("T (s)", 6), ("tok/s", 6), ("MFU", 5), ("gap", 5), ("×sym", 5), ("solve s", 7), ("used", 5)):
        table.add_column(col, justify="right", no_wrap=True, min_width=width)
    for r in rows:
        t = _fmt(r.iteration_s, ".4g")
        if r.iteration_s is not None and r.iteration_s == best:
            t = f"[bold green]{t}[/]"
        style = STATUS_STYLE.get(r.status, "")
        table.add_row(r.solver, f"[{style}]{r.status}[/]" if style else r.status, t,
                      _kilo(r.tokens_per_s), _fmt(r.mfu, ".1%"), _fmt(r.gap, ".1%"),
                      _fmt(r.speedup, ".2f", "×"), _fmt(r.wall_s, ".2g"),
                      "—" if r.devices_used is None else f"{r.devices_used}/{problem.cluster.num_devices}")
    return table


def write_csv(rows: list[ComparisonRow], path: Path) -> None:
    fields = list(ComparisonRow.model_fields)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(r.model_dump() for r in rows)


def write_json(rows: list[ComparisonRow], path: Path) -> None:
    Path(path).write_text(json.dumps([r.model_dump() for r in rows], indent=2) + "\n")


def parse_solvers(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SOLVERS]
    if unknown:
        fail(f"--solvers: unknown solver {', '.join(map(repr, unknown))}; available: {', '.join(SOLVERS)}")
    if not names:
        fail("--solvers: give at least one solver name")
    return names


def _progress(status, message: str) -> None:
    """The spinner on a terminal; a line on stderr otherwise (a log shows where the work is)."""
    status.update(message)
    if not err_console.is_terminal:
        err_console.print(message, highlight=False)


@app.command()
@friendly_errors
def compare(
    problems: list[str] = typer.Argument(..., help="problem files or bundled names"),
    solvers: str = typer.Option(DEFAULT_SOLVERS, "--solvers", "-s", help="comma-separated solver names"),
    time_limit: float = typer.Option(60.0, "--time-limit", "-t", min=0.001, help="seconds per solver run"),
    exact_time_limit: float = typer.Option(None, min=0.001, help="seconds per cpsat/milp run (default: --time-limit)"),
    exact_max_devices: int = typer.Option(32, help="skip cpsat/milp on clusters larger than this"),
    seed: int = typer.Option(0, help="random seed for the randomized solvers"),
    csv_path: Path = typer.Option(None, "--csv", help="write all rows as CSV"),
    json_path: Path = typer.Option(None, "--json-file", help="write all rows as JSON"),
    as_json: bool = typer.Option(False, "--json", help="print all rows as JSON instead of tables (as solve --json)"),
    plans_dir: Path = typer.Option(None, "--plans", help="save each plan as PROBLEM.SOLVER.json here"),
) -> None:
    """Run several solvers on the same problems and compare their plans side by side."""
    names = parse_solvers(solvers)
    for path, option in ((csv_path, "--csv"), (json_path, "--json-file")):
        writable_file(path, option)  # before any solving, as bad problem files are
    writable_folder(plans_dir, "--plans")
    loaded = [load_problem(p) for p in problems]  # bad files fail before any solving
    options = SolverOptions(time_limit_s=time_limit, seed=seed)
    exact = SolverOptions(time_limit_s=exact_time_limit, seed=seed) if exact_time_limit else None
    everything: list[ComparisonRow] = []
    for problem in loaded:
        with err_console.status("") as status:  # stderr: stdout may carry JSON
            rows = compare_problem(problem, names, options, exact_max_devices, plans_dir,
                                   on_start=lambda p, s: _progress(status, f"solving {p} with {s} …"),
                                   exact_options=exact)
        if not as_json:
            console.print(comparison_table(problem, rows))
        everything += rows
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in everything], indent=2))
    else:
        console.print("[dim]T, tokens/s and MFU by planner.evaluate; gap = (T − best proven bound) / T; "
                      "× sym = T_symmetric / T.[/]")
    if csv_path:
        write_csv(everything, csv_path)
    if json_path:
        write_json(everything, json_path)
