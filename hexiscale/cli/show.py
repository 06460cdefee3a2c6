"""`hexiscale show`: pictures of a plan (layered: cluster graph, the cost model's pipeline timeline, memory
bars; sequence: the rings and per-device time and memory bars), by the plan's kind."""

from __future__ import annotations

from pathlib import Path

import typer

from hexiscale.cli.app import WorkLog, app, check_plan_is_for, console, fail, friendly_errors, writable_folder
from hexiscale.cli.views import views_for
from planner.io import load_plan, load_problem
from planner.kinds import validate


@app.command()
@friendly_errors
def show(problem: str = typer.Argument(..., help="problem file or bundled name"),
         plan: str = typer.Argument(..., help="plan file or bundled plan name"),
         out: Path = typer.Option(Path("."), "--out", "-o", help="folder for the PNG files"),
         prefix: str = typer.Option("", help="prefix of the file names: PREFIX-cluster.png, ..."),
         force: bool = typer.Option(False, "--force", help="draw a plan made for another problem")) -> None:
    """Draw a plan. Layered: cluster.png (pipelines and stages on the cluster), schedule.png
    (the cost model's §3.3 flow line per stage: forward, backward, communication, bubble; its
    span is T_pipe — not a trace of the order that runs) and memory.png (per device vs
    capacity). Sequence (§7): ring.png (each replica's ring: groups by token share, members by
    tokens with heads, the mirrored token layout) and devices.png (per device, the iteration's
    time by term up to T, and memory by part against capacity)."""
    from hexiscale.viz import draw_plan  # matplotlib only when drawing

    if any(sep in prefix for sep in ("/", "\\")) or prefix in (".", ".."):
        fail(f"--prefix: {prefix!r} is a path; give a plain name and the folder with --out")
    writable_folder(out, "--out")
    prob, the_plan = load_problem(problem), load_plan(plan)
    check_plan_is_for(prob, the_plan, plan, force)
    work = WorkLog.for_cluster(prob.cluster)
    work.step("checking the plan")
    structural = [v for v in validate(prob, the_plan) if v.rule != "memory"]
    if structural:
        fail(f"{plan}: cannot draw an invalid plan: " + "; ".join(str(v) for v in structural))
    for path in draw_plan(prob, the_plan, out, prefix, on_step=work.step):
        console.print(f"[green]wrote[/] {path}")
    bridge = views_for(the_plan).bridge_view(prob, the_plan, None)  # mixed-vendor clusters only
    if bridge is not None:
        console.print(bridge)
    work.finish()
