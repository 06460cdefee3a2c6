"""A run's loss curve, `loss.png`: the training loss of every step (the mean token
cross-entropy of its batch, before its update), the held-out loss where one was measured
(`--eval-data`), the warm-up steps that the run's timing means leave out shaded, and — when
the run clipped its gradients (`--clip-grad`) — the gradients' global norm under it, against
the clipping threshold. `hexiscale run` writes it into its out folder; `hexiscale show
RUN_FOLDER` draws it again from the folder's step records."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from runtime.config import Job  # noqa: E402
from runtime.metrics.runlog import RUNLOG_FILE, WARMUP_STEPS, after_warmup  # noqa: E402
from planner.base import plural

STEPS_FILE, METRICS_FILE, JOB_FILE = "steps.jsonl", "metrics.json", "job.json"
LOSS_PICTURE = "loss.png"
SMOOTH_FROM = 50  # from this many steps on, a moving mean is drawn over the noisy per-step loss
TRAIN, EVAL, NORM = "#4C72B0", "#DD8452", "#55A868"


class RunFolderError(ValueError):
    """A run folder whose step records cannot be drawn; the message names the file and why."""


def is_run_folder(path: Path) -> bool:
    """A folder that `hexiscale run --out` wrote: it holds a run log or step records."""
    return path.is_dir() and any((path / name).is_file() for name in (RUNLOG_FILE, STEPS_FILE, METRICS_FILE))


def read_run_steps(folder: Path) -> list[dict]:
    """The step records of a run folder: metrics.json's (a finished run), else steps.jsonl's
    (written as the run goes: also a run cut short)."""
    metrics, steps = folder / METRICS_FILE, folder / STEPS_FILE
    try:
        if metrics.is_file():
            records = json.loads(metrics.read_text())["steps"]
        elif steps.is_file():
            records = [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]
        else:
            raise RunFolderError(f"{folder}: no {STEPS_FILE} or {METRICS_FILE} (the run log {RUNLOG_FILE} "
                                 f"holds timings, not losses)")
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise RunFolderError(f"{metrics if metrics.is_file() else steps}: not a run's step records ({exc})") from None
    if not records or any(not isinstance(r, dict) or "step" not in r or "loss" not in r for r in records):
        raise RunFolderError(f"{folder}: its step records hold no steps with a loss")
    return records


def read_job(folder: Path) -> Job | None:
    """The folder's job file (what ran: plan, model, settings), or None when it has none
    this version can read."""
    try:
        return Job.model_validate_json((folder / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None


def run_title(folder: Path, records: list[dict], job: Job | None) -> str:
    """'FOLDER — model M, KIND plan, B×s tokens per step' (the job, when known) and the loss
    from first to last step, with the mean tokens/s after the warm-up."""
    title = folder.resolve().name
    if job is not None:
        title += (f" — model {job.config.model.name}, {job.kind} plan, {job.plan.global_batch}×{job.config.seq_len} "
                  f"tokens per step")
    speeds = [r["tokens_per_s"] for r in after_warmup(records) if "tokens_per_s" in r]
    speed = f"; {sum(speeds) / len(speeds):,.0f} tokens/s" if speeds else ""
    return (f"{title}\nloss {records[0]['loss']:.4f} (step {records[0]['step']}) → {records[-1]['loss']:.4f} "
            f"(step {records[-1]['step']}){speed}")


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of each value and the window − 1 before it (fewer at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    starts = np.maximum(np.arange(1, len(values) + 1) - window, 0)
    return (sums[1:] - sums[starts]) / (np.arange(1, len(values) + 1) - starts)


def _draw_losses(ax, records: list[dict]) -> None:
    steps = np.array([r["step"] for r in records])
    losses = np.array([r["loss"] for r in records], dtype=float)
    smooth = len(records) >= SMOOTH_FROM
    ax.plot(steps, losses, color=TRAIN, linewidth=0.8 if smooth else 1.6, alpha=0.45 if smooth else 1.0,
            marker="" if len(steps) > 40 else "o", markersize=3.5, label="train loss (per step)")
    last = losses[-1]
    if smooth:
        window = max(5, len(records) // 40)
        means = moving_mean(losses, window)
        ax.plot(steps, means, color=TRAIN, linewidth=2.0, label=f"train loss, mean of {plural(window, 'step')}")
        last = means[-1]
    evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if evals:
        x, y = zip(*evals)
        ax.plot(x, y, color=EVAL, linestyle="--", linewidth=1.2, marker="D", markersize=6, label="eval loss")
        ax.annotate(f"{y[-1]:.3f}", (x[-1], y[-1]), xytext=(6, 6), textcoords="offset points", color=EVAL,
                    fontsize=8)
    ax.annotate(f"{last:.3f}", (steps[-1], last), xytext=(6, -12), textcoords="offset points", color=TRAIN,
                fontsize=8)
    ax.margins(x=0.07, y=0.1)  # room for the last values' labels
    ax.set_ylabel("loss (mean token cross-entropy)")
    ax.grid(alpha=0.3)


def _mark_warmup(axes, records: list[dict]) -> None:
    """Shade the run's first WARMUP_STEPS steps (a resumed run's first steps are a fresh
    process's too) on every panel; one legend entry."""
    first = records[0]["step"]
    if len(records) <= WARMUP_STEPS:
        return
    for index, ax in enumerate(axes):
        ax.axvspan(first - 0.5, first + WARMUP_STEPS - 0.5, color="#BBBBBB", alpha=0.35, linewidth=0,
                   label=f"warm-up: first {WARMUP_STEPS} steps, left out of tokens/s and timing means"
                   if index == 0 else None)


def _draw_norms(ax, records: list[dict], clip: float | None) -> None:
    steps = [r["step"] for r in records if "grad_norm" in r]
    norms = [r["grad_norm"] for r in records if "grad_norm" in r]
    ax.plot(steps, norms, color=NORM, linewidth=1.4, marker="" if len(steps) > 40 else "o", markersize=3,
            label="gradient norm before clipping")
    if clip is not None:
        ax.axhline(clip, color="black", linestyle=":", linewidth=1.2, label=f"--clip-grad {clip:g}")
    ax.set_ylim(0, max(norms + [clip or 0]) * 1.15)
    ax.set_ylabel("global grad norm")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8, frameon=False)


def draw_loss(records: list[dict], path: str | Path, title: str = "", clip: float | None = None) -> Path:
    """Write the loss curve of `records` (step records of one run, in order) to `path` (PNG)."""
    norms = any("grad_norm" in r for r in records)
    fig, axes = plt.subplots(2 if norms else 1, 1, figsize=(9, 6.4 if norms else 4.6), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3]} if norms else None)
    axes = list(axes[:, 0])
    _draw_losses(axes[0], records)
    if norms:
        _draw_norms(axes[1], records, clip)
    _mark_warmup(axes, records)
    axes[0].legend(loc="upper right", fontsize=8, frameon=False)
    axes[-1].set_xlabel("optimizer step")
    if len(records) <= 20:
        axes[-1].set_xticks([r["step"] for r in records])
    axes[0].set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def draw_run(folder: str | Path, out_dir: str | Path | None = None, records: list[dict] | None = None) -> Path:
    """Draw a run folder's loss curve into out_dir/loss.png (default: the run folder);
    `records`: the steps to draw (default: the folder's step records)."""
    folder = Path(folder)
    records = records or read_run_steps(folder)
    out = Path(out_dir) if out_dir is not None else folder
    out.mkdir(parents=True, exist_ok=True)
    job = read_job(folder)
    clip = job.config.clip_grad if job is not None else None
    return draw_loss(records, out / LOSS_PICTURE, run_title(folder, records, job), clip)
