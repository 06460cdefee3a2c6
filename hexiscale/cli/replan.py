"""`hexiscale replan`: remove lost devices (or machines) from a problem, re-plan on the
survivors with the old plan as the warm start, and say what changed and the new T. Either
plan kind: the plan file's kind picks the repair and the solvers (`solvers.replan`)."""

from __future__ import annotations

from pathlib import Path

import typer

from hexiscale.cli.budget import CommandBudget
from hexiscale.cli.app import app, check_plan_is_for, console, fail, friendly_errors, writable_file
from planner.base import format_seconds, plural
from planner.io import load_plan, load_problem, problem_to_dict, save_plan, save_yaml
from solvers.common import SolverOptions
from solvers.replan import ReplanError, ReplanResult, replan as replan_plan


def id_list(text: str, option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()] if text else []
    if text and not items:
        fail(f"{option}: expected a comma-separated list, got {text!r}")
    return items


def device_ids(text: str) -> list[int]:
    ids = id_list(text, "--lost")
    bad = [t for t in ids if not t.isdigit()]
    if bad:
        fail(f"--lost: device ids are integers, got {', '.join(bad)}")
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
                  f"{result.problem.cluster.num_devices} survive; {moved_ids(result)}", highlight=False, soft_wrap=True)
    repaired = format_seconds(result.repaired_s) if result.repaired_s is not None else "invalid"
    fresh = format_seconds(result.fresh_s) if result.fresh_s is not None else "no plan"
    console.print(f"candidates: repaired old plan {repaired}, fresh solve {fresh}; chose {result.chosen} "
                  f"({result.wall_s:.2f} s)", highlight=False, soft_wrap=True)
    for line in result.changes:
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    console.print(f"new T = {format_seconds(result.new_s)}", highlight=False)


@app.command()
@friendly_errors
def replan(problem: str = typer.Argument(..., help="problem file or bundled name"),
           plan: str = typer.Argument(..., help="the plan that lost devices"),
           lost: str = typer.Option("", help="lost device ids, comma-separated (the problem's ids)"),
           lost_machines: str = typer.Option("", help="lost machines (names or indices), comma-separated"),
           solver: str = typer.Option("heuristic", help="solver of the fresh solve, of the plan's kind (layered cpsat/milp take the warm start)"),
           time_limit: float = typer.Option(60.0, "--time-limit", "-t", help="wall-clock budget of the whole command (repair, fresh "
                                                       "solve, output), s"),
           output: Path = typer.Option(None, "--output", "-o", help="write the new plan (new device ids) here, and "
                                       "the survivors' problem that it names beside it"),
           problem_out: Path = typer.Option(None, help="write the survivors' problem here instead (its ids)"),
           force: bool = typer.Option(False, help="use a plan made for another problem")) -> None:
    """Re-plan after losing devices.

    The new plan is written in the survivors' device ids, and the survivors'
    problem beside it (the plan names it)."""
    budget = CommandBudget(time_limit)
    writable_file(output, "--output")
    writable_file(problem_out, "--problem-out")
    prob, old = load_problem(problem), load_plan(plan)
    check_plan_is_for(prob, old, plan, force)
    devices, machines = device_ids(lost), id_list(lost_machines, "--lost-machines")
    if not devices and not machines:
        fail("name what was lost: --lost 3,7 and/or --lost-machines NAME,...")
    try:
        result = replan_plan(prob, old, devices, lost_machines=machines, solver=solver,
                             options=SolverOptions(time_limit_s=replan_budget(budget, prob.cluster.num_devices)))
    except (ReplanError, KeyError) as exc:
        fail(str(exc).strip("'\""))
    print_result(result)
    problem_out = problem_out or (survivors_path(output, result) if output else None)
    if problem_out:
        save_yaml(problem_to_dict(result.problem), problem_out)
        console.print(f"wrote {problem_out} (the survivors' problem, {result.problem.name})", highlight=False)
    if output:
        save_plan(result.plan, output)
        console.print(f"wrote {output}; judge it with: hexiscale evaluate {problem_out} {output}", highlight=False)


# writing the survivors' problem file (YAML) after the solve: 2.6 s at 10^5 GPUs, measured
WRITE_PROBLEM_PER_DEVICE_S = 4e-5


def replan_budget(budget: CommandBudget, devices: int) -> float:
    """The re-plan's share of the command's limit: what is left less the output and the problem file."""
    return max(0.05, budget.for_solver(devices, explain=False) - WRITE_PROBLEM_PER_DEVICE_S * devices)


def survivors_path(output: Path, result: ReplanResult) -> Path:
    """Where the survivors' problem goes by default: beside the plan, named as the plan names it."""
    return output.with_name(f"{result.problem.name}.yaml")
