"""`hexiscale show`: pictures of a plan (layered: cluster graph, the cost model's pipeline timeline, memory
bars; sequence: the rings and per-device time and memory bars), by the plan's kind; or, given
the folder of a run (`hexiscale run --out`), its loss curve."""

from __future__ import annotations

from pathlib import Path

import typer

from hexiscale.cli.app import WorkLog, app, check_plan_is_for, console, fail, friendly_errors, writable_folder, writing
from hexiscale.cli.price_views import rental_view
from hexiscale.cli.views import plain, views_for
from planner.io import load_plan, load_problem
from planner.kinds import validate


@app.command()
@friendly_errors
def show(problem: str = typer.Argument(..., help="problem file or bundled name; or a run's folder (run --out)"),
         plan: str = typer.Argument(None, help="plan file or bundled plan name (not with a run folder)"),
         out: Path = typer.Option(None, "--out", "-o", help="folder for the PNG files (default: the current "
                                  "folder; for a run folder, the run folder)"),
         prefix: str = typer.Option("", help="prefix of the file names: PREFIX-cluster.png, ..."),
         force: bool = typer.Option(False, "--force", help="draw a plan made for another problem")) -> None:
    """Draw a plan (or a run's losses) as PNG pictures.

    Layered plans: cluster.png (pipelines and stages on the cluster);
    schedule.png (the cost model's §3.3 flow line per stage: forward, backward,
    communication, bubble; its span is T_pipe, not a trace of the order that
    runs); memory.png (per device, against capacity).

    Sequence plans (§7): ring.png (each replica's ring: groups by token share,
    members by tokens with heads, the mirrored token layout); devices.png (per
    device, the iteration's time by term up to T, and memory by part against
    capacity).

    A run's folder: loss.png (train loss per step, eval losses, the warm-up
    steps, the gradient norm under --clip-grad)."""
    from hexiscale.viz import draw_plan  # matplotlib only when drawing

    if show_run(problem, plan, out):
        return
    out = out or Path(".")
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
    with writing(out):
        for path in draw_plan(prob, the_plan, out, prefix, on_step=work.step):
            console.print(f"[green]wrote[/] {plain(path)}")
    bridge = views_for(the_plan).bridge_view(prob, the_plan, None)  # mixed-vendor clusters only
    if bridge is not None:
        console.print(bridge)
    rental = rental_view(prob, the_plan.devices)  # priced clusters only (docs/prices.md §13)
    if rental is not None:
        console.print(rental)
    work.finish()


def show_run(folder: str, plan: str | None, out: Path | None) -> bool:
    """Draw the loss curve of a run folder (one holding runlog.json or steps.jsonl); False
    when `folder` is not one, and the plan's pictures are wanted."""
    from hexiscale.viz.loss import RunFolderError, draw_run, is_run_folder  # matplotlib only when drawing

    if not is_run_folder(Path(folder)):
        if plan is None:
            from runtime.launch.elastic import elastic_folder_refusal

            fail(elastic_folder_refusal(Path(folder)) or
                 f"{folder}: expected PROBLEM PLAN, or the folder of a run (one holding runlog.json or steps.jsonl)")
        return False
    if plan is not None:
        fail(f"{folder} is a run folder: show draws its loss curve and takes no plan (got {plan!r})")
    writable_folder(out, "--out")
    try:
        with writing(out or folder):
            path = draw_run(folder, out)
    except RunFolderError as exc:
        fail(str(exc))
    console.print(f"[green]wrote[/] {plain(path)}", highlight=False)
    return True


def write_loss_picture(run_folder: str, steps: list[dict]) -> None:
    """After `hexiscale run`: RUN_FOLDER/loss.png of every step it ran (an elastic run's
    attempts together, which its folder's step records no longer hold)."""
    from hexiscale.viz.loss import draw_run  # matplotlib only when drawing

    if steps:
        console.print(f"loss curve: {plain(draw_run(run_folder, records=steps))}", highlight=False, soft_wrap=True)
