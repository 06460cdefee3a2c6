"""`hexiscale solve PROBLEM --solver NAME`: any registered solver, its plan as a table with
the evaluator's estimate and the solver's proof status (status, bound, gap)."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import typer
from rich import box
from rich.table import Table

from hexiscale.cli.budget import CommandBudget
from hexiscale.cli.hf_run import note_if_own_model_cannot_run
from hexiscale.cli.paths import file_read, refuse_same_file
from hexiscale.cli.price_views import price_rows
from hexiscale.cli.views import plain, views_for
from hexiscale.cli.app import (EXIT_INFEASIBLE, app, check_plan_is_for, console, err_console, fail, friendly_errors,
                               seed_option, time_limit_option, writable_file, writing)
from planner.kinds import evaluate, kind_of, validate
from planner.io import load_plan, load_problem, save_plan
from planner.base import Frozen, format_seconds
from planner.solver_info import SolverInfo, SolveStatus
from planner.problem import Problem
from solvers.choose import AUTO_KIND
from solvers.choose import solve as solve_any_kind
from solvers.common import SolveResult, SolverOptions
from solvers.registry import DEFAULT_KIND, SOLVERS_BY_KIND, solvers_listed, solvers_of

WARM_STARTED = ("cpsat", "milp")  # the solvers that read SolverOptions.hint
LOGGED_PROGRESS = ("cpsat", "milp")  # the solvers whose progress is log lines, not a bar redrawn in place
STATUS_STYLE = {"optimal": "green", "feasible": "cyan", "unknown": "yellow", "infeasible": "magenta"}


@app.command()
@friendly_errors
def solve(
    problem: str = typer.Argument(..., help="problem file or bundled name"),
    solver: str = typer.Option("heuristic", "--solver", "-s", help="registered solver, by plan kind: " + solvers_listed()),
    kind: str = typer.Option(AUTO_KIND, "--kind", help="plan kind: auto (every kind that has the solver, the "
                             "better plan by the objective kept), " + ", ".join(SOLVERS_BY_KIND)),
    time_limit: float = time_limit_option("wall-clock budget of the whole command (loading, solving, output), s"),
    threads: int = typer.Option(2, "--threads", min=1, help="worker threads"),
    seed: int = seed_option(),
    max_pipelines: int = typer.Option(None, "--max-pipelines", min=1, help="limit on D (reported if it may cut the optimum)"),
    max_stages: int = typer.Option(None, "--max-stages", min=1, help="limit on stages per pipeline"),
    hint: str = typer.Option(None, "--hint", help="layered plan file to warm-start cpsat or milp from"),
    force: bool = typer.Option(False, "--force", help="use a --hint made for another problem"),
    output: Path = typer.Option(None, "--output", "-o", help="write the plan (with its solver info) here"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON instead of tables"),
    full: bool = typer.Option(False, "--full", help="print every stage (group) of a large plan, not its summary"),
    verbose: bool = typer.Option(False, "--verbose", help="print the backend's own log"),
) -> None:
    """Find a plan with one solver; print it with its estimate and proof status."""
    budget = CommandBudget(time_limit)
    check_kind_and_solver(kind, solver)
    refuse_same_file(output, "--output", {"the problem file read": file_read(problem),
                                          "the --hint plan read": file_read(hint)})
    writable_file(output, "--output")
    prob = load_problem(problem)
    hint_plan = usable_hint(prob, hint, solver, kind, force)  # every input before any output
    # with --json the spinner alone (drawn on a terminal, then gone): the solvers' progress includes the
    # exact solvers' log lines, which would stay on stderr; off a terminal (a log, 2>file) those lines
    # alone: the heuristics' bars, redrawn in place, left a blank line per redraw there
    options = SolverOptions(time_limit_s=budget.for_solver(prob.cluster.num_devices), threads=threads, seed=seed,
                            hint=hint_plan, max_pipelines=max_pipelines, max_stages=max_stages,
                            progress=not as_json and (err_console.is_terminal or solver in LOGGED_PROGRESS),
                            verbose=verbose)
    result = _run_with_spinner(prob, solver, kind, options, budget)
    if result.kind_reason and not as_json:
        err_console.print(f"plan kind: {kind_of(result.plan).name if result.plan is not None else kind} "
                          f"({result.kind_reason})", highlight=False, markup=False)
    if result.plan is None:
        _report_no_plan(result, as_json)
    plan = _checked(prob, result)
    if output is not None:
        with writing(output):
            save_plan(plan, output)
    estimate = evaluate(prob, plan)
    if as_json:
        console.print_json(json.dumps(dict(result_dict(result, estimate), kind=kind_of(plan).name,
                                           kind_reason=result.kind_reason, kinds_tried=result.kinds_tried)))
        return
    for view in views_for(plan).solved_views(prob, plan, estimate, full=full,
                                                      deadline=budget.output_deadline(prob.cluster.num_devices)):
        console.print(view)
    console.print(status_table(result, estimate, prob))
    note_if_own_model_cannot_run(prob, plan)
    if output is not None:
        console.print(f"plan written to [bold]{plain(output)}[/]")


def usable_hint(problem: Problem, path: str | None, solver: str, kind: str, force: bool):
    """The --hint plan when the solve can use it, else None with a note saying why not: only the
    layered cpsat and milp read a warm start (SolverOptions.hint is a layered plan). A plan made
    for another problem needs --force, as everywhere a plan is read."""
    if path is None:
        return None
    plan = load_plan(path)
    check_plan_is_for(problem, plan, path, force)
    why = _no_warm_start(kind_of(plan).name, solver, kind)
    if why:
        err_console.print(f"note: --hint is ignored: {why}", highlight=False, markup=False, soft_wrap=True)
        return None
    broken = validate(problem, plan)  # the solver would drop it with a progress line only
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        fail(f"--hint: {path}: the plan is invalid for {problem.name}, so it cannot warm-start {solver}: "
             f"[{broken[0].rule}] {broken[0].message}{more}")
    return plan


def _no_warm_start(plan_kind: str, solver: str, kind: str) -> str:
    """Why a hint of `plan_kind` cannot warm-start `solver` in `kind` ('' when it can)."""
    if solver not in WARM_STARTED:
        return f"{solver} takes no warm start (the exact solvers do: {', '.join(WARM_STARTED)})"
    if plan_kind != DEFAULT_KIND:
        return f"it is a {plan_kind} plan; only layered plans warm-start {solver}"
    if kind not in (AUTO_KIND, DEFAULT_KIND):
        return f"the {kind} {solver} takes no warm start; the layered one does"
    return ""


def check_kind_and_solver(kind: str, solver: str) -> None:
    """`--kind` is auto or a kind with solvers; the solver exists for that kind (any kind for auto)."""
    if kind != AUTO_KIND and kind not in SOLVERS_BY_KIND:
        fail(f"--kind: unknown plan kind {kind!r}; available: {AUTO_KIND}, {', '.join(SOLVERS_BY_KIND)}")
    kinds = [kind] if kind != AUTO_KIND else list(SOLVERS_BY_KIND)
    if not any(solver in solvers_of(k) for k in kinds):
        listed = ", ".join(f"{k}: {', '.join(solvers_of(k))}" for k in kinds)
        fail(f"unknown solver {solver!r} for {' or '.join(kinds)} plans; available: {listed}")


def _run_with_spinner(problem: Problem, solver: str, kind: str, options: SolverOptions,
                      budget: CommandBudget) -> SolveResult:
    """Run the solver while a spinner shows the command's time against its limit (`-t`, what the
    user set; the solver's own limit is less by the output's share); solvers log their own progress."""
    run = functools.partial(solve_any_kind, solver=solver, kind=kind)
    box_ = {}
    with err_console.status(f"solving {plain(problem.name)} with {solver} …") as status:
        worker = threading.Thread(target=lambda: box_.update(result=_call(run, problem, options)), daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.25)
            status.update(f"solving {plain(problem.name)} with {solver} … {budget.elapsed():.0f} s "
                          f"of the command's {budget.limit_s:g} s")
    outcome = box_["result"]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _call(solve_fn, problem: Problem, options: SolverOptions):
    try:
        return solve_fn(problem, options=options)
    except BaseException as exc:  # re-raised in the main thread
        return exc


def _report_no_plan(result: SolveResult, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(result_dict(result, None)))
    reason = result.message or "no reason given"
    if result.status == SolveStatus.infeasible:
        fail(f"infeasible: {reason}", code=EXIT_INFEASIBLE)
    fail(f"no plan found ({result.status.value}): {reason}", code=EXIT_INFEASIBLE)


def _checked(problem: Problem, result: SolveResult):
    violations = validate(problem, result.plan)
    if violations:
        fail(f"{result.solver} returned an invalid plan: " + "; ".join(map(str, violations)))
    if result.plan.solver is not None:
        return result.plan
    return result.plan.model_copy(update={"solver": SolverInfo(
        name=result.solver, status=result.status, objective_s=result.objective_s,
        bound_s=result.bound_s, wall_s=result.wall_s)})


def status_table(result: SolveResult, estimate: Frozen, problem: Problem | None = None) -> Table:
    table = Table(box=box.SIMPLE, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    style = STATUS_STYLE.get(result.status.value, "")
    kind = kind_of(result.plan)
    table.add_row("iteration time", f"{format_seconds(estimate.iteration_s, 6)}  ({kind.unit}s "
                                    f"{format_seconds(kind.units_s(estimate))} + DP sync {format_seconds(estimate.dp_s)})")
    table.add_row("throughput", f"{estimate.tokens_per_s:,.0f} tokens/s   MFU {estimate.mfu:.1%}")
    for label, text in price_rows(problem, result.plan.devices, estimate) if problem is not None else ():
        table.add_row(label, text)
    table.add_row("bottleneck", plain(estimate.bottleneck.description))
    table.add_row("solver", f"{result.solver}: [{style}]{result.status.value}[/] in {result.wall_s:.1f} s")
    if result.bound_s is not None:
        gap = result.gap
        table.add_row("lower bound", format_seconds(result.bound_s, 6) + (f"  (gap {gap:.2%})" if gap is not None else ""))
    if result.model_size is not None:
        size = result.model_size
        table.add_row("model size", f"{size.variables:,} variables, {size.constraints:,} constraints"
                      if size.variables else "no model was built in the time limit")
    for r in result.restrictions:
        table.add_row("restriction", f"[yellow]{plain(r)}[/]")
    if result.message:
        table.add_row("note", plain(result.message))
    return table


def result_dict(result: SolveResult, estimate: Frozen | None) -> dict:
    out = result.model_dump(mode="json", exclude_none=True, exclude={"plan", "kind_reason"})
    out["gap"] = result.gap
    if result.plan is not None:
        out["plan"] = json.loads(result.plan.to_json())
    if estimate is not None:
        out["estimate"] = {"iteration_s": estimate.iteration_s, "tokens_per_s": estimate.tokens_per_s,
                           "mfu": estimate.mfu, "bottleneck": estimate.bottleneck.description}
        if estimate.rent_per_hour is not None:  # prices present (docs/prices.md §13)
            out["rent_per_hour"] = out["estimate"]["rent_per_hour"] = estimate.rent_per_hour
            out["cost_per_mtok"] = out["estimate"]["cost_per_mtok"] = estimate.cost_per_mtok
    return out
