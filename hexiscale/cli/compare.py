"""`hexiscale compare`: every solver on the same problems, judged by the one evaluator.

Each solver's plan is re-checked with `planner.validate` and priced with the evaluator's figures
(`planner.kinds.headline`: `evaluate`'s T, tokens/s, MFU and rent without its per-stage parts;
never with the solver's own figure), so the columns compare like with like: iteration time,
tokens/s, MFU, the gap to the best lower bound any exact solver of the same plan kind proved,
the speed-up over the kind's homogeneous baseline (`symmetric`, Megatron-style, for layered
plans; `seq-uniform`, Megatron CP / USP, for sequence plans), and the solve wall time.

Each problem is compared in one plan kind (`--kind`, `auto` as `hexiscale solve` chooses it);
solver names are that kind's, or `KIND:NAME` for another kind's. On a sequence (long-context)
problem the best layered plan (`layered:heuristic`) is priced too, one row labelled with its
kind, so that the table shows which kind wins at that sequence length.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import typer
from pydantic import Field
from rich import box
from rich.table import Table

from hexiscale.cli.budget import CommandBudget
from hexiscale.cli.compare_files import (check_plan_files, check_tables, plan_file, refuse_repeated_solvers,
                                         split_name)
from hexiscale.cli.views import plain
from hexiscale.cli.app import (app, console, err_console, fail, friendly_errors, progress_line, seed_option,
                               time_limit_option, writable_file, writable_folder, writing)
from planner.base import Frozen, plural, write_atomically
from planner.io import load_problem, save_plan
from planner.kinds import headline, kind_of, validate
from planner.problem import Objective, Problem
from solvers.choose import AUTO_KIND, choose_kind
from solvers.common import SolveResult, SolverOptions
from solvers.kinds import SOLVER_KINDS, solver_kind
from solvers.registry import DEFAULT_KIND, SOLVERS_BY_KIND, solve

EXACT_SOLVERS = ("cpsat", "milp")
# each kind's defaults, its speed-up column's baseline and the other kinds' rows priced beside
# its own come from its `SolverKind` (solvers.kinds)


class ComparisonRow(Frozen):
    problem: str
    solver: str
    kind: str = Field(default=DEFAULT_KIND, description="plan kind of the solver's plan: layered | sequence")
    status: str = Field(description="solver status, or skipped | error | invalid")
    iteration_s: float | None = Field(default=None, description="T by planner.evaluate")
    tokens_per_s: float | None = None
    mfu: float | None = None
    bound_s: float | None = Field(default=None, description="this solver's proven lower bound")
    gap: float | None = Field(default=None, description="(T − best bound of any solver) / T")
    speedup: float | None = Field(default=None, description="T_reference / T: symmetric (layered problems) "
                                                            "or seq-uniform (sequence problems)")
    wall_s: float | None = Field(default=None, description="solve wall time")
    devices_used: int | None = None
    pipelines: int | None = Field(default=None, description="pipelines (layered) or replicas (sequence)")
    rent_per_hour: float | None = Field(default=None, description="rent of the machines the plan uses, per hour "
                                                                  "(docs/prices.md §13; None without prices)")
    cost_per_mtok: float | None = Field(default=None, description="cost per million tokens (None without prices)")
    message: str = ""


def _call_solver(problem: Problem, kind: str, name: str, options: SolverOptions) -> SolveResult:
    if kind == DEFAULT_KIND:
        return solve(problem, name, options)
    return solve(problem, name, options, kind=kind)


def run_solver(problem: Problem, name: str, options: SolverOptions, exact_max_devices: int,
               kind: str = DEFAULT_KIND) -> tuple[ComparisonRow, SolveResult | None]:
    """One solver on one problem, its plan judged by the evaluator; failures become rows.
    `name` is one of `kind`'s solvers, or `KIND:NAME`."""
    kind, name = split_name(name, kind)
    base = dict(problem=problem.name, solver=name, kind=kind)
    if name in EXACT_SOLVERS and problem.cluster.num_devices > exact_max_devices:
        return ComparisonRow(**base, status="skipped", message=f"{plural(problem.cluster.num_devices, 'device')} > "
                             f"--exact-max-devices {exact_max_devices}"), None
    try:
        result = _call_solver(problem, kind, name, options)
    except Exception as exc:  # a crashing solver is a row of the table, not the end of the run
        return ComparisonRow(**base, status="error", message=f"{type(exc).__name__}: {exc}"), None
    row = dict(base, status=result.status.value, bound_s=result.bound_s, wall_s=result.wall_s,
               message=result.message)
    if result.plan is None:
        return ComparisonRow(**row), result
    violations = validate(problem, result.plan)
    if violations:
        return ComparisonRow(**dict(row, status="invalid", message=str(violations[0]))), result
    est = headline(problem, result.plan)  # the row's figures, without simulating every schedule
    units = kind_of(result.plan).units(result.plan)
    return ComparisonRow(**row, iteration_s=est.iteration_s, tokens_per_s=est.tokens_per_s, mfu=est.mfu,
                         devices_used=len(result.plan.devices), pipelines=len(units),
                         rent_per_hour=est.rent_per_hour, cost_per_mtok=est.cost_per_mtok), result


def with_cross_kind(solvers: list[str], kind: str) -> list[str]:
    """The solvers plus the other kinds' solvers that `kind` is compared with
    (`SolverKind.also_compare`: on a sequence problem, the best layered plan), unless a solver
    of another kind is already asked for."""
    extra = list(solver_kind(kind).also_compare)
    if not extra or any(split_name(s, kind)[0] != kind for s in solvers):
        return list(solvers)
    return list(solvers) + extra


class SharedBudget:
    """One command's time limit shared by its solver runs: each run gets an equal part of what
    is left (a quick baseline leaves its unused part to the runs after it)."""

    def __init__(self, budget: CommandBudget, runs: int):
        self.budget, self.runs_left = budget, max(1, runs)

    def next_run(self, options: SolverOptions, devices: int) -> SolverOptions:
        share = self.budget.for_solver(devices, explain=False) / self.runs_left
        self.runs_left = max(1, self.runs_left - 1)
        return options.model_copy(update={"time_limit_s": min(options.time_limit_s, share)})

    def skip(self, options: SolverOptions) -> SolverOptions:
        self.runs_left = max(1, self.runs_left - 1)
        return options


def compare_problem(problem: Problem, solvers: list[str], options: SolverOptions, exact_max_devices: int = 32,
                    plans_dir: Path | None = None, on_start=None,
                    exact_options: SolverOptions | None = None, kind: str = DEFAULT_KIND,
                    shared: SharedBudget | None = None) -> list[ComparisonRow]:
    """All solvers (of `kind`, or `KIND:NAME`) on one problem, with gap and speed-up filled in
    from the others' results. `exact_options` (default: `options`) is what cpsat and milp run
    with. The gap is against the best bound proved for the row's own kind; the speed-up
    against `kind`'s reference baseline (`SolverKind.reference`), for every row."""
    rows, reference, ref_name = [], None, solver_kind(kind).reference
    for spec in solvers:
        row_kind, name = split_name(spec, kind)
        if on_start:
            on_start(problem.name, name if row_kind == kind else spec)
        opts = exact_options if exact_options is not None and name in EXACT_SOLVERS else options
        if shared is not None:  # a skipped exact run takes no time: its part goes to the others
            skipped = name in EXACT_SOLVERS and problem.cluster.num_devices > exact_max_devices
            opts = shared.skip(opts) if skipped else shared.next_run(opts, problem.cluster.num_devices)
        row, result = run_solver(problem, spec, opts, exact_max_devices, kind)
        rows.append(row)
        if plans_dir is not None and result is not None and result.plan is not None:
            with writing(plan_file(plans_dir, problem.name, spec, kind)) as path:
                plans_dir.mkdir(parents=True, exist_ok=True)
                save_plan(result.plan, path)
        if row_kind == kind and name == ref_name:
            reference = row
    if reference is None:  # the speed-up column needs the reference figure even if not asked for
        ref_options = options if shared is None else shared.next_run(options, problem.cluster.num_devices)
        reference, _ = run_solver(problem, ref_name, ref_options, exact_max_devices, kind)
    best_bound = {}
    for r in rows:  # the tightest proven lower bound of each kind
        if r.bound_s is not None:
            best_bound[r.kind] = max(best_bound.get(r.kind, r.bound_s), r.bound_s)
    return [_with_relative(r, best_bound.get(r.kind), reference.iteration_s) for r in rows]


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
    """Tokens per second in k or M: 134.4M, not 134420.0k."""
    if x is None:
        return "—"
    return f"{x / 1e6:.1f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


STATUS_STYLE = {"optimal": "green", "feasible": "cyan", "unknown": "yellow", "infeasible": "magenta",
                "skipped": "dim", "error": "red", "invalid": "red"}


def comparison_table(problem: Problem, rows: list[ComparisonRow]) -> Table:
    """One row per solver; each row's note goes in the caption so the numbers fit 80 columns.
    A table mixing plan kinds gets a kind column; its speed-up column is against the main
    kind's reference (the kind of the first row)."""
    kinds = list(dict.fromkeys(r.kind for r in rows)) or [DEFAULT_KIND]
    mixed = len(kinds) > 1
    notes = "\n".join(f"{r.solver if r.kind == kinds[0] else r.kind + ':' + r.solver}: {r.message}"
                      for r in rows if r.message)
    # no bounds, no column: unless the kind's defaults run exact solvers (then "—" says none was proved)
    show_gap = (any(name in EXACT_SOLVERS for name in solver_kind(kinds[0]).default_solvers)
                or any(r.gap is not None for r in rows))
    plans = "" if kinds == [DEFAULT_KIND] else f", {kinds[0]} plans" + (
        " and the best " + ", ".join(kinds[1:]) + " plan" if mixed else "")
    table = Table(title=f"{plain(problem.name)}: {plain(problem.model.name)} on {plain(problem.cluster.name)} "
                        f"({problem.cluster.num_devices} GPUs, s = {problem.training.seq_len:,}{plans})",
                  box=box.SIMPLE_HEAD, header_style="bold",
                  caption=plain(notes) or None, caption_justify="left", padding=0, pad_edge=False,
                  collapse_padding=True, show_edge=False)
    priced = any(r.rent_per_hour is not None for r in rows)  # docs/prices.md §13
    _add_columns(table, rows, mixed, show_gap, priced, solver_kind(kinds[0]).reference_label)
    best = _best(problem, rows)
    for r in rows:
        style = STATUS_STYLE.get(r.status, "")
        t, cost = _fmt(r.iteration_s, ".4g"), _fmt(r.cost_per_mtok, ".4g")
        if r is best and problem.objective == Objective.cost:  # the objective's figure in bold
            cost = f"[bold green]{cost}[/]"
        elif r is best:
            t = f"[bold green]{t}[/]"
        table.add_row(r.solver, *([r.kind] if mixed else []),
                      f"[{style}]{r.status}[/]" if style else r.status, t,
                      *([] if priced else [_kilo(r.tokens_per_s)]), _fmt(r.mfu, ".1%"),
                      *([_fmt(r.gap, ".1%")] if show_gap else []),
                      _fmt(r.speedup, ".2f", "×"), _fmt(r.wall_s, ".2g"),
                      "—" if r.devices_used is None else f"{r.devices_used}/{problem.cluster.num_devices}",
                      *([_fmt(r.rent_per_hour, ",.2f"), cost] if priced else []))
    return table


def _add_columns(table: Table, rows: list[ComparisonRow], mixed: bool, show_gap: bool, priced: bool,
                 ref: str) -> None:
    """The solver's name always whole (the rows differ by it alone; kind, status and the figures
    may agree); on a narrow terminal the numeric columns fold instead."""
    table.add_column("solver", no_wrap=True, min_width=max((len(r.solver) for r in rows), default=6))
    if mixed:
        table.add_column("kind", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col, width in (("T (s)", 5), ("tok/s", 6), ("MFU", 5), ("gap", 5), (ref, 5), ("solve s", 5), ("used", 5),
                       ("$/h", 5), ("$/Mtok", 6)):
        # with prices, rent and cost take tokens/s's place (T says it) so that the table fits 80 columns
        if (col != "gap" or show_gap) and (col not in ("$/h", "$/Mtok") or priced) and (col != "tok/s" or not priced):
            table.add_column(col, justify="right", overflow="fold", min_width=width)


def _best(problem: Problem, rows: list[ComparisonRow]) -> ComparisonRow | None:
    """The row best by the problem's objective: least T, or least cost per token under objective
    cost (a tie: the first row)."""
    cost = problem.objective == Objective.cost
    figure = (lambda r: r.cost_per_mtok) if cost else (lambda r: r.iteration_s)
    found = [r for r in rows if r.iteration_s is not None and figure(r) is not None]
    return min(found, key=figure, default=None)


def write_csv(rows: list[ComparisonRow], path: Path) -> None:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(ComparisonRow.model_fields))
    writer.writeheader()
    writer.writerows(r.model_dump() for r in rows)
    write_atomically(path, text.getvalue())


def write_json(rows: list[ComparisonRow], path: Path) -> None:
    write_atomically(path, json.dumps([r.model_dump() for r in rows], indent=2) + "\n")


def parse_solvers(spec: str | None, kind: str = AUTO_KIND) -> list[str]:
    """Solver names (`KIND:NAME` for another kind's) checked against the registry; None: the
    kind's defaults (resolved per problem under `auto`, see `solvers_for`)."""
    if spec is None:
        return [] if kind == AUTO_KIND else list(solver_kind(kind).default_solvers)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    kinds = list(SOLVERS_BY_KIND) if kind == AUTO_KIND else [kind]
    unknown = [n for n in names if not _known(n, kinds)]
    if unknown:
        listed = "; ".join(f"{k}: {', '.join(SOLVERS_BY_KIND[k])}" for k in kinds)
        fail(f"--solvers: unknown solver {', '.join(map(repr, unknown))}; available: {listed} "
             f"(KIND:NAME for another kind's)")
    if not names:
        fail("--solvers: give at least one solver name")
    refuse_repeated_solvers(names, kind)
    return names


def _known(spec: str, kinds: list[str]) -> bool:
    if ":" in spec:
        kind, name = spec.split(":", 1)
        return name in SOLVERS_BY_KIND.get(kind, {})
    return any(spec in SOLVERS_BY_KIND[k] for k in kinds)


def solvers_for(problem: Problem, kind: str, names: list[str]) -> tuple[str, list[str], str]:
    """The plan kind one problem is compared in, its solver list (with the cross-kind row) and
    why that kind: an explicit --kind wins; under `auto`, the one kind having every plain name
    given, else `choose_kind`'s rule (long context → sequence)."""
    plain = [n for n in names if ":" not in n]
    having = [k for k, entries in SOLVERS_BY_KIND.items() if plain and all(n in entries for n in plain)]
    if kind == AUTO_KIND and len(having) == 1:
        kind, why = having[0], f"of the plan kinds only {having[0]} has every solver named: {', '.join(plain)}"
    else:
        kind, why = choose_kind(problem, kind)
    missing = [n for n in plain if n not in SOLVERS_BY_KIND[kind]]
    if missing:
        fail(f"--solvers: {problem.name} is compared in {kind} plans ({why or 'given by --kind'}), which have "
             f"no solver {', '.join(map(repr, missing))}; write KIND:NAME or pass --kind")
    refuse_repeated_solvers(names, kind)  # `heuristic,layered:heuristic` is one solver twice in layered plans
    chosen = names or list(solver_kind(kind).default_solvers)
    return kind, with_cross_kind(chosen, kind), why


@app.command()
@friendly_errors
def compare(
    problems: list[str] = typer.Argument(..., help="problem files or bundled names"),
    solvers: str = typer.Option(None, "--solvers", "-s", help="comma-separated solver names of the plan kind "
                                "(KIND:NAME for another kind's); default: " + "; ".join(
                                    f"{k.name} {','.join(k.default_solvers)}" for k in SOLVER_KINDS.values())),
    kind: str = typer.Option(AUTO_KIND, "--kind", help="plan kind: auto (as hexiscale solve), " + ", ".join(SOLVERS_BY_KIND)),
    time_limit: float = time_limit_option("wall-clock budget of the whole command, s: its solver runs share it "
                                          "equally (a quick run leaves its rest)"),
    exact_time_limit: float = time_limit_option("at most this many seconds per cpsat/milp run", None,
                                                "--exact-time-limit"),
    exact_max_devices: int = typer.Option(32, min=0, help="skip cpsat/milp on clusters larger than this"),
    seed: int = seed_option("random seed for the randomized solvers"),
    csv_path: Path = typer.Option(None, "--csv", help="write all rows as CSV"),
    json_path: Path = typer.Option(None, "--json-file", help="write all rows as JSON"),
    as_json: bool = typer.Option(False, "--json", help="print all rows as JSON instead of tables (as solve --json)"),
    plans_dir: Path = typer.Option(None, "--plans", help="save each plan as PROBLEM.SOLVER.json here"),
) -> None:
    """Run several solvers on the same problems and compare their plans side by side."""
    budget = CommandBudget(time_limit)
    if kind != AUTO_KIND and kind not in SOLVERS_BY_KIND:
        fail(f"--kind: unknown plan kind {kind!r}; available: {AUTO_KIND}, {', '.join(SOLVERS_BY_KIND)}")
    names = parse_solvers(solvers, kind)
    written = check_tables(problems, csv_path, json_path)  # neither over a problem file, nor over the other
    for path, option in ((csv_path, "--csv"), (json_path, "--json-file")):
        writable_file(path, option)  # before any solving, as bad problem files are
    writable_folder(plans_dir, "--plans")
    loaded = [load_problem(p) for p in problems]  # bad files fail before any solving
    plans = [solvers_for(p, kind, names) for p in loaded]  # and so do solvers of the wrong kind
    check_plan_files(plans_dir, problems, loaded, [(k, s) for k, s, _ in plans], written)
    options = SolverOptions(time_limit_s=time_limit, seed=seed)
    exact = SolverOptions(time_limit_s=exact_time_limit, seed=seed) if exact_time_limit else None
    shared = SharedBudget(budget, sum(len(s) + (solver_kind(k).reference not in s) for k, s, _ in plans))
    everything: list[ComparisonRow] = []
    for problem, (problem_kind, problem_solvers, why) in zip(loaded, plans):
        if why and not as_json:
            err_console.print(f"{problem.name}: plan kind {problem_kind} ({why})", highlight=False, markup=False)
        with err_console.status("") as status:  # stderr: stdout may carry JSON
            rows = compare_problem(problem, problem_solvers, options, exact_max_devices, plans_dir,
                                   on_start=lambda p, s: progress_line(status, f"solving {p} with {s} …"),
                                   exact_options=exact, kind=problem_kind, shared=shared)
        if not as_json:
            console.print(comparison_table(problem, rows))
        everything += rows
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in everything], indent=2))
    else:
        _footer({k for k, _, _ in plans})
    if csv_path:
        with writing(csv_path):
            write_csv(everything, csv_path)
    if json_path:
        with writing(json_path):
            write_json(everything, json_path)


def _footer(kinds: set[str]) -> None:
    refs = "; ".join(f"{k.reference_label} = T_{k.reference} / T" for k in SOLVER_KINDS.values() if k.name in kinds)
    console.print("[dim]T, tokens/s and MFU by planner.evaluate; gap = (T − best proven bound of the row's plan "
                  f"kind) / T; {refs}.[/]")
