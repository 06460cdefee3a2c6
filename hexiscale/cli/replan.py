"""`hexiscale replan`: remove lost devices (or machines) from a problem, re-plan on the
survivors with the old plan as the warm start, and say what changed and the new T. Either
plan kind: the plan file's kind picks the repair and the solvers (`solvers.replan`)."""

from __future__ import annotations

from pathlib import Path

import typer

from hexiscale.cli.budget import CommandBudget
from hexiscale.cli.paths import file_read, refuse_same_file, same_as
from hexiscale.cli.app import (EXIT_INFEASIBLE, app, check_plan_is_for, console, fail, friendly_errors,
                               invalid_plan_line, time_limit_option, writable_file, writing)
from planner.base import file_stem, format_seconds, plural
from planner.violations import InvalidPlanError
from planner.io import InputError, load_plan, load_problem, problem_to_dict, read_mapping, save_plan, save_yaml
from solvers.common import SolverOptions
from solvers.replan import (NoReplanError, ReplanError, ReplanResult, lost_devices, replan as replan_plan,
                            survivors, survivors_name)


def id_list(text: str, option: str) -> list[str]:
    """The items of a comma-separated list; an empty item ('3,,4', '3,') is probably a typo."""
    items = [t.strip() for t in text.split(",")] if text else []
    if items and not all(items):
        fail(f"{option}: expected a comma-separated list without empty items, got {text!r}")
    return items


def device_ids(text: str) -> list[int]:
    ids = id_list(text, "--lost")
    bad = [t for t in ids if not (t.isascii() and t.isdigit())]  # '²' and '٣' are digits to str.isdigit
    if bad:
        fail(f"--lost: device ids are integers ≥ 0, got {', '.join(bad)}")
    return [int(t) for t in ids]


def moved_ids(result: ReplanResult) -> str:
    """The id shift, compactly: only the survivors whose id changed."""
    moved = [(old, new) for old, new in result.old_to_new.items() if old != new]
    if not moved:
        return "device ids unchanged"
    shown = ", ".join(f"{o}→{n}" for o, n in moved[:12]) + (f", … ({len(moved)} in all)" if len(moved) > 12 else "")
    return f"device ids shift (old→new): {shown}"


def print_result(result: ReplanResult) -> None:
    lost = ", ".join(map(str, result.lost[:20])) + (" …" if len(result.lost) > 20 else "")
    console.print(f"lost {plural(len(result.lost), 'device')} ({lost}); "
                  f"{result.problem.cluster.num_devices} survive; {moved_ids(result)}", highlight=False,
                  soft_wrap=True, markup=False)
    repaired = (format_seconds(result.repaired_s) if result.repaired_s is not None
                else f"invalid ({result.repaired_why})" if result.repaired_why else "invalid")
    fresh = format_seconds(result.fresh_s) if result.fresh_s is not None else \
        f"no plan ({result.fresh_why})" if result.fresh_why else "no plan"
    console.print(f"candidates: repaired old plan {repaired}, fresh solve {fresh}; chose {result.chosen} "
                  f"(re-planned in {result.wall_s:.2f} s)", highlight=False, soft_wrap=True, markup=False)
    for line in result.changes:
        console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"new T = {format_seconds(result.new_s)}", highlight=False)


@app.command()
@friendly_errors
def replan(problem: str = typer.Argument(..., help="problem file or bundled name"),
           plan: str = typer.Argument(..., help="the plan that lost devices"),
           lost: str = typer.Option("", help="lost device ids, comma-separated (the problem's ids)"),
           lost_machines: str = typer.Option("", help="lost machines (names or indices), comma-separated"),
           solver: str = typer.Option("heuristic", help="solver of the fresh solve, of the plan's kind (layered cpsat/milp take the warm start)"),
           time_limit: float = time_limit_option("wall-clock budget of the whole command (repair, fresh solve, "
                                                 "output), s"),
           output: Path = typer.Option(None, "--output", "-o", help="write the new plan (new device ids) here, and "
                                       "the survivors' problem that it names beside it"),
           problem_out: Path = typer.Option(None, help="write the survivors' problem here instead (its ids)"),
           force: bool = typer.Option(False, help="use a plan made for another problem")) -> None:
    """Re-plan after losing devices.

    The new plan is written in the survivors' device ids, and the survivors'
    problem beside it (the plan names it)."""
    budget = CommandBudget(time_limit)
    taken = checked_outputs(problem, plan, output, problem_out)
    prob, old = load_problem(problem), load_plan(plan)
    check_plan_is_for(prob, old, plan, force)
    devices, machines = device_ids(lost), id_list(lost_machines, "--lost-machines")
    if not devices and not machines:
        fail("name what was lost: --lost 3,7 and/or --lost-machines NAME,...")
    try:  # what was lost is checked before the solve (an unknown or repeated id), in the options' names
        gone = lost_devices(prob, devices, machines, names=("--lost", "--lost-machines"))
        if problem_out is None and output is not None:  # its name says what was lost: known before the solve
            problem_out = survivors_path(output, prob, gone, taken)
        result = replan_plan(prob, old, devices, lost_machines=machines, solver=solver,
                             options=SolverOptions(time_limit_s=replan_budget(budget, prob.cluster.num_devices)))
    except InvalidPlanError as exc:  # the re-plan checks the plan's structure (over memory it repairs)
        fail(invalid_plan_line(plan, prob.name, exc.violations))
    except NoReplanError as exc:
        fail(str(exc), code=EXIT_INFEASIBLE)
    except (ReplanError, KeyError) as exc:
        fail(str(exc).strip("'\""))
    print_result(result)
    write_result(result, output, problem_out)


def checked_outputs(problem: str, plan: str, output: Path | None,
                    problem_out: Path | None) -> dict[str, Path | None]:
    """Both outputs writable, neither over an input nor over the other (the problem was written,
    then the plan over it); returns the files the survivors' default problem file must not be."""
    taken = {"the problem file read": file_read(problem), "the plan file read": file_read(plan)}
    refuse_same_file(output, "--output", taken)
    taken["the --output plan file"] = output
    refuse_same_file(problem_out, "--problem-out", taken)
    writable_file(output, "--output")
    writable_file(problem_out, "--problem-out")
    return taken


def write_result(result: ReplanResult, output: Path | None, problem_out: Path | None) -> None:
    """The survivors' problem, then the plan that names it."""
    if problem_out:
        with writing(problem_out):
            save_yaml(problem_to_dict(result.problem), problem_out)
        console.print(f"wrote {problem_out} (the survivors' problem, {result.problem.name})", highlight=False,
                      markup=False, soft_wrap=True)
    if output:
        with writing(output):
            save_plan(result.plan, output)
        console.print(f"wrote {output}; judge it with: hexiscale evaluate {problem_out} {output}", highlight=False,
                      markup=False, soft_wrap=True)  # a command to paste: never cut into lines


# writing the survivors' problem file (YAML) after the solve: 2.6 s at 10^5 GPUs, measured
WRITE_PROBLEM_PER_DEVICE_S = 4e-5


def replan_budget(budget: CommandBudget, devices: int) -> float:
    """The re-plan's share of the command's limit: what is left less the output and the problem file."""
    return max(0.05, budget.for_solver(devices, explain=False) - WRITE_PROBLEM_PER_DEVICE_S * devices)


def survivors_path(output: Path, problem, lost: set[int], taken: dict[str, Path | None]) -> Path:
    """Where the survivors' problem goes by default: beside the plan, named as the plan names it
    (by the lost devices). Not over a file the command reads or writes (`taken`: `-o X.yaml`
    where X is that name wrote the problem, then the plan over it), nor over an existing file
    that holds another problem (the problem was edited since): the plans judged by it would be
    judged wrongly."""
    path = output.with_name(f"{file_stem(survivors_name(problem.name, lost))}.yaml")
    if what := same_as(path, taken):
        fail(f"--output: the survivors' problem goes beside the plan, to {path}, which is {what}: "
             f"name it with --problem-out")
    if path.exists() and _mapping_or_none(path) != problem_to_dict(survivors(problem, lost)[0]):
        fail(f"{path} exists and holds another problem than the survivors' (a plan judged by it would be "
             f"judged wrongly): move it, or name the file with --problem-out")
    return path


def _mapping_or_none(path: Path) -> dict | None:
    try:
        return read_mapping(path)
    except InputError:
        return None
