"""validate / evaluate / instances / schema."""

from __future__ import annotations

import typer

from hexiscale.cli.app import app, console, fail, friendly_errors
from planner.io import load_plan, load_problem
from planner.validate import validate as validate_plan


@app.command()
@friendly_errors
def validate(problem: str = typer.Argument(..., help="problem file or bundled name"),
             plan: str = typer.Argument(None, help="plan file to check against the problem")) -> None:
    """Check a problem file, and a plan against it (every violation, with numbers)."""
    prob = load_problem(problem)
    if plan is None:
        console.print(f"[green]ok[/] problem {prob.name}: {prob.cluster.num_devices} devices, "
                      f"{len(prob.cluster.machines)} machines, model {prob.model.name}")
        return
    violations = validate_plan(prob, load_plan(plan))
    if violations:
        for v in violations:
            console.print(f"[red]✗[/] {v}", highlight=False)
        fail(f"{plan}: plan is invalid ({len(violations)} violations)")
    console.print(f"[green]ok[/] plan {plan} is valid for {prob.name}")
