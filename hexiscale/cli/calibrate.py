"""`hexiscale calibrate`: refit η per GPU type, and bandwidth and latency per link class, from
run logs (docs/calibration.md §9); and the predicted-against-measured view that `hexiscale run` prints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer
import yaml
from pydantic import ValidationError
from rich.table import Table

from hexiscale.cli.app import STATISTIC_HELP, app, checked_statistic, console, fail, friendly_errors, writable_file
from hexiscale.cli.views import views_for
from planner.calibration import CalibrationError
from planner.calibration_runs import Figure, RunRecord, predicted_rows, refit
from planner.kinds import PLAN_KINDS, kind_of
from planner.violations import InvalidPlanError
from runtime.config import Job
from runtime.host import shared_cores_note
from runtime.launch.commands import rank0_machine
from runtime.kinds import RUNTIME_KINDS
from runtime.profiling.launcher import Repeated  # the mean's standard error, as profile's repetitions have it
from runtime.metrics.runlog import RUNLOG_FILE, WARMUP_STEPS, RunLog, log_run, read_run_log
from planner.base import plural, write_atomically


def torchrun_refusal(path: Path) -> str:
    """Why a --torchrun run's folder has no run log: only the machine that holds rank 0 writes
    one, into its own out folder, once the run has done its steps (runtime/launch/worker.py);
    named from the folder's job file where it can be read."""
    base = f"{path}: a --torchrun run's folder without {RUNLOG_FILE}"
    try:
        job = Job.model_validate_json((path / "job.json").read_text())
        name = job.cluster.machines[rank0_machine(job.plan, job.cluster)].name
    except (OSError, ValueError, AttributeError, IndexError):  # unreadable, or a job without its cluster
        return f"{base}: the machine that holds rank 0 writes it into its --out folder once the run has done its steps"
    if job.problem is None:
        return (f"{base}: its job file names no problem, so no machine writes one (a job file written before "
                f"--torchrun runs wrote run logs): write it again with `hexiscale run --torchrun`")
    return (f"{base}: machine {name}, which holds rank 0, writes it into {job.config.out_dir or 'its --out folder'} "
            f"there once the run has done its steps (this is another machine's folder, or the run failed or has not "
            f"ended)")


def run_log_path(path: Path) -> Path:
    """A run log file, or a run's out folder holding one (runlog.json)."""
    if not path.is_dir():
        return path
    inside = path / RUNLOG_FILE
    if not inside.is_file() and (path / "job.json").is_file() and not any(path.glob("rank*.log")):
        fail(torchrun_refusal(path))
    if not inside.is_file():
        from runtime.launch.elastic import elastic_folder_refusal

        fail(elastic_folder_refusal(path) or
             f"{path}: a folder without {RUNLOG_FILE}: give a run's out folder (hexiscale run --out) or its "
             f"{RUNLOG_FILE}")
    return inside


def checked_logs(run_logs: list[Path], output: Path) -> list[Path]:
    """The run logs' paths, refused where one is named twice (its steps would count twice in the
    fit) or where --output would write over one of them."""
    paths = [run_log_path(p) for p in run_logs]
    seen: dict[Path, Path] = {}
    for path in paths:
        if path.resolve() in seen:
            fail(f"{path}: given twice (as {seen[path.resolve()]}): its steps would count twice in the fit")
        seen[path.resolve()] = path
    if output.resolve() in seen:
        fail(f"--output: {output} is one of the run logs read: write the cluster elsewhere")
    return paths


def load_log(path: Path) -> RunLog:
    """A run log, or one line naming the file and what is wrong with it (exit 2)."""
    try:
        return read_run_log(path)
    except OSError as exc:
        fail(f"{path}: cannot read: {exc.strerror or exc}")
    except json.JSONDecodeError as exc:
        fail(f"{path}: not valid JSON (truncated or corrupted?): {exc.msg} at line {exc.lineno}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        fail(f"{path}: corrupted run log: {where}: {first['msg']}")
    except ValueError as exc:
        fail(f"{path}: {exc}")


def check_steps_after_warmup(logs: list[tuple[Path, RunLog]], warmup: int) -> None:
    """Every log needs a step after its warm-up: the first steps also pay for touching memory
    first (runtime.metrics.runlog.WARMUP_STEPS), and a fit on them alone prices that as slow
    compute. Refused, not fitted silently on the warm-up steps."""
    for path, log in logs:
        if len(log.steps) <= warmup:
            fail(f"{path}: every step of this run is warm-up ({plural(len(log.steps), 'step')}, --warmup {warmup}): "
                 f"none is left to fit; run more --steps (at least {warmup + 1}) or pass a smaller --warmup")


def check_same_run_setup(logs: list[tuple[Path, RunLog]]) -> None:
    """Every log must be of one problem on one cluster: mixing them is probably a mistake."""
    first_path, first = logs[0]
    for path, log in logs[1:]:
        if log.cluster_hash != first.cluster_hash:
            fail(f"{path}: ran on another cluster (sha256 {log.cluster_hash[:12]}) than {first_path} "
                 f"({first.cluster_hash[:12]})")
        if log.problem_hash != first.problem_hash:
            fail(f"{path}: a run of problem {log.problem!r} (sha256 {log.problem_hash[:12]}), not of "
                 f"{first.problem!r} (sha256 {first.problem_hash[:12]}) like {first_path}")


def errors_of(record: RunRecord, cluster=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(measured rows, predicted rows, relative errors): each stage's τ, then the step time T."""
    problem = record.problem if cluster is None else record.problem.model_copy(update={"cluster": cluster})
    predicted = predicted_rows(problem, record.plan)
    measured = np.array([*record.stage_s, record.step_s])
    return measured, predicted, predicted / measured - 1.0


def prediction_table(record: RunRecord, title: str) -> Table:
    table = Table(title=title)
    for column in ("unit", "devices", "shape", "measured ms", "predicted ms", "error"):
        table.add_column(column, justify="right")
    measured, predicted, error = errors_of(record)
    for i, (unit, devices, shape) in enumerate(views_for(record.plan).timed_units(record.plan)):
        table.add_row(unit, devices, shape, f"{measured[i] * 1e3:.2f}", f"{predicted[i] * 1e3:.2f}", f"{error[i]:+.1%}")
    table.add_row("step", "", "", f"{measured[-1] * 1e3:.2f}", f"{predicted[-1] * 1e3:.2f}", f"{error[-1]:+.1%}")
    if (simulated := getattr(views_for(record.plan), "simulated_step", None)) is not None:
        label, seconds = simulated(record.problem, record.plan)
        table.add_row(label, "", "", f"{measured[-1] * 1e3:.2f}", f"{seconds * 1e3:.2f}", f"{seconds / measured[-1] - 1:+.1%}")
    return table


COLLECTIVE_LABEL = {"tp": "TP collectives (T_tp)", "hp": "HP all-to-alls", "zero": "ZeRO-3 gathers and scatters"}


def collectives_table(record: RunRecord) -> Table | None:
    """Of each unit that spent time in its collectives (a TP stage; a sequence replica's HP
    all-to-alls and ZeRO-3 collectives, as its busiest member timed them): that time per
    micro-batch against the cost model's part of τ or T_mb above; None when there is none."""
    rows = record.collective_rows()
    if not rows:
        return None
    predicted = predicted_rows(record.problem, record.plan, rows)[-len(rows):]
    units = views_for(record.plan).timed_units(record.plan)
    table = Table(title="of which collectives per micro-batch: measured against the cost model's part")
    for column in ("unit", "devices", "collectives", "measured ms", "predicted ms", "error"):
        table.add_column(column, justify="right")
    for (kind, i), priced in zip(rows, predicted):
        measured = record.collective_s(kind, i)
        table.add_row(units[i][0], units[i][1], COLLECTIVE_LABEL[kind], f"{measured * 1e3:.2f}",
                      f"{priced * 1e3:.2f}", f"{priced / measured - 1:+.1%}")
    return table


def step_spread(log: RunLog, warmup: int = WARMUP_STEPS) -> str:
    """How far the measured step times scatter: the yardstick for the errors above (a miss
    within a few standard errors is the run's own noise, not the cost model's)."""
    times = [s.step_s for s in log.steps[warmup:]]
    if not times:
        return (f"measured: {len(log.steps)} step(s), all warm-up (the first {warmup}): the times above include "
                f"it, and its noise is not known (run more --steps)")
    if len(times) < 2:
        return f"measured: {len(times)} step after warm-up, so its noise is not known (run more --steps)"
    summary = Repeated.of(times)
    return (f"measured step over {plural(len(times), 'step')} after warm-up: {min(times) * 1e3:.1f}–{max(times) * 1e3:.1f} ms, "
            f"mean {summary.mean_s * 1e3:.1f} ms ± {summary.mean_error:.1%} (its standard error)")


def print_prediction(problem, job, result) -> None:
    """After a run: write its run log and show predicted against measured times."""
    path = log_run(problem, job, result)
    if path is None:
        return
    log = read_run_log(path)
    record = log.record(str(path))
    try:
        console.print(prediction_table(record, views_for(record.plan).PREDICTION_TITLE))
        if (collectives := collectives_table(record)) is not None:
            console.print(collectives)
        console.print(step_spread(log), highlight=False, soft_wrap=True)
    except (InvalidPlanError, ValueError) as exc:  # e.g. a tiny run's scaled shares break a token block
        console.print(f"note: the run's shape cannot be priced by the cost model: {exc}", highlight=False)
    if job.config.backend == "gloo" and (shared := shared_cores_note(len(job.plan.devices))):
        console.print(f"note: {shared}", highlight=False, soft_wrap=True)
    if not any(g.name in {m.gpu for m in problem.cluster.machines} for g in problem.cluster.gpu_types):
        console.print("note: the cluster's figures are catalog values, not this machine's: run "
                      "`hexiscale profile` and plan on its cluster to compare like with like", highlight=False)
    console.print(f"run log: {path} (for `hexiscale calibrate`)", highlight=False)


def links_note(records: list[RunRecord], figures: list[Figure]) -> str:
    """Which traffic the refitted links describe, when they were refitted: a link's figures
    differ by operation (`profile --for` fits each plan kind's own), so links refitted from
    one kind's runs misprice the other kind's plans ("" when no link figure moved)."""
    if not any(f.kind != "efficiency" and f.exercised and not f.kept_why for f in figures):
        return ""
    kinds = sorted({kind_of(r.plan).name for r in records})
    if len(kinds) > 1:
        return (f"the links are refitted from {' and '.join(kinds)} runs together: one figure per link class for "
                f"{' and '.join(RUNTIME_KINDS[k].profiled_op.replace('_', '-') + 's' for k in kinds)} alike, "
                f"which `profile --for` fits apart")
    kind, others = PLAN_KINDS[kinds[0]], [k for k in PLAN_KINDS if k != kinds[0]]
    plans, fors = " or ".join(others), " / ".join(f"--for {k}" for k in others)
    return (f"the links are refitted from {kind.name} runs (their {kind.link_traffic}): for {plans} plans, "
            f"keep the links of a cluster from `hexiscale profile {fors}` and take η from here")


def figures_table(figures, collective_times: bool = False) -> Table:
    rows = "stage, step and collective times" if collective_times else "stage and step times"
    table = Table(title=f"refitted figures (least squares over every log's {rows})")
    for column in ("figure", "of", "before", "after", "note"):
        table.add_column(column, justify="right")
    for f in figures:
        unit = {"efficiency": "", "bandwidth": " GB/s", "latency": " µs"}[f.kind]
        note = f"kept: {f.kept_why}" if f.kept_why else "" if f.exercised else "kept: no run depends on it"
        table.add_row("η" if f.kind == "efficiency" else f.kind, f.name, f"{f.before:.4g}{unit}",
                      f"{f.after:.4g}{unit}", note)
    return table


@app.command()
@friendly_errors
def calibrate(run_logs: list[Path] = typer.Argument(..., help="runs' out folders (hexiscale run --out) or their "
                                                  "runlog.json files"),
              output: Path = typer.Option(..., "-o", "--output", help="cluster file (YAML) to write"),
              warmup: int = typer.Option(WARMUP_STEPS, min=0, help="steps of each run left out as warm-up"),
              statistic: str = typer.Option("mean", help=STATISTIC_HELP),
              keep_undetermined: bool = typer.Option(False, help="keep a figure the runs cannot determine at its "
                                                     "logged value (and say so) instead of refusing the fit"),
              collective_times: bool = typer.Option(
                  False, "--collective-times", "--tp-times",
                  help="also fit each unit's recorded collective times (a TP stage's, a sequence replica's HP "
                       "all-to-alls and ZeRO-3 collectives): the links as the collectives took them; compute a "
                       "TP rank does not share then lowers η for every plan")) -> None:
    """Refit η per GPU type, bandwidth and latency per link class from run logs; write the cluster."""
    writable_file(output, "--output")
    checked_statistic(statistic)
    logs = [(path, load_log(path)) for path in checked_logs(run_logs, output)]
    check_same_run_setup(logs)
    check_steps_after_warmup(logs, warmup)
    records = [log.record(str(path), warmup, statistic) for path, log in logs]
    try:
        cluster, figures = refit(records, keep_undetermined=keep_undetermined, collective_times=collective_times)
    except CalibrationError as exc:
        hint = "" if keep_undetermined else " (--keep-undetermined keeps such a figure as logged)"
        fail(f"{exc}; {output} not written{hint}")
    console.print(figures_table(figures, collective_times))
    before = np.concatenate([np.abs(errors_of(r)[2]) for r in records])
    after = np.concatenate([np.abs(errors_of(r, cluster)[2]) for r in records])
    console.print(f"|error| over {len(before)} stage and step times: mean {before.mean():.1%} → {after.mean():.1%}, "
                  f"worst {before.max():.1%} → {after.max():.1%}", highlight=False)
    header = f"# Refitted by `hexiscale calibrate` from {len(records)} run log(s) of problem {logs[0][1].problem}.\n"
    if note := links_note(records, figures):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
        header += f"# {note}.\n"
    write_atomically(output, header + yaml.safe_dump(cluster.model_dump(mode="json", exclude_defaults=True),
                                                     sort_keys=False))
    console.print(f"wrote {output}", highlight=False)
