"""The run log (`hexiscale.runlog/1`, `runlog.json` in a run's out_dir): what a run measured,
self-contained, for `hexiscale calibrate` (docs/calibration.md §9). No torch.

It names the problem the run was made for (name and sha256) and the cluster (sha256 of its
canonical JSON), and carries the problem *as run* — that cluster, the model actually trained,
the run's seq_len, micro-batch, recompute and schedule — so the cost model prices exactly what
ran. Per step: the step time (schedule + gradient sync, the slowest rank: what T prices), the
whole step's wall time (optimizer included, which the cost model does not price), and per
stage (a layered plan) the leader's forward, backward, communication (stage-to-stage receives
and broadcasts, waits included), gradient-sync seconds and the part of forward and backward
spent in TP collectives, or per member (a sequence plan) its
forward and backward seconds, attention exchanges and ZeRO-3 gathers included and also
timed apart.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from collections.abc import Sequence
from typing import Literal, TypeVar

import numpy as np

from pydantic import Field, model_validator

from planner.base import Frozen, write_atomically
from planner.calibration import Statistic, summarize
from planner.calibration_runs import RunRecord
from planner.hardware import Cluster
from planner.kinds import AnyPlan, kind_of
from planner.problem import Problem
from planner.workload import TrainingSpec

# Steps of a run left out of its summaries: what the cost model prices is the steady step. A
# fresh process's first steps also touch its memory for the first time — the optimizer's
# state in step 1, then gradients and activations in memory not yet mapped in step 2: over
# six runs on this project's 2-core machine step 2 took 15–25 % longer than the steps after
# it (one process alone: its compute 263 ms per micro-batch against 205–217 ms from step 3
# on, and none of that excess when the process's memory had been touched before).
WARMUP_STEPS = 2
T = TypeVar("T")


def after_warmup(steps: Sequence[T], warmup: int = WARMUP_STEPS) -> Sequence[T]:
    """The steps after the first `warmup`, or all of them when there are no more (a short run's
    own view; `hexiscale calibrate` refuses to fit such a log: hexiscale/cli/calibrate.py)."""
    return steps[warmup:] or steps


RUNLOG_FORMAT = "hexiscale.runlog/1"
RUNLOG_FILE = "runlog.json"
METRICS_FILE = "metrics.json"  # rank 0's step records of a finished run (its workers write it)


class StageTiming(Frozen):
    pipeline: int = Field(ge=0, description="pipeline index")
    stage: int = Field(ge=0, description="stage index in its pipeline")
    forward_s: float = Field(ge=0, allow_inf_nan=False, description="forward passes, seconds")
    backward_s: float = Field(ge=0, allow_inf_nan=False, description="backward passes, seconds")
    comm_s: float = Field(ge=0, allow_inf_nan=False, description="stage-to-stage exchange, waits included")
    sync_s: float = Field(ge=0, allow_inf_nan=False, description="data-parallel gradient sync, seconds")
    tp_s: float = Field(default=0.0, ge=0, allow_inf_nan=False,
                        description="TP collectives, seconds (part of forward_s + backward_s; 0 at TP size 1)")


class MemberTiming(Frozen):
    replica: int = Field(ge=0, description="replica index")
    group: int = Field(ge=0, description="group index in its replica's ring")
    member: int = Field(ge=0, description="member index in its group")
    forward_s: float = Field(ge=0, allow_inf_nan=False, description="forward passes (attention exchanges included)")
    backward_s: float = Field(ge=0, allow_inf_nan=False, description="backward passes (exchanges included)")
    hp_s: float = Field(default=0.0, ge=0, allow_inf_nan=False,
                        description="head-parallel all-to-alls, seconds (part of forward_s + backward_s)")
    zero_s: float = Field(default=0.0, ge=0, allow_inf_nan=False,
                          description="ZeRO-3 all-gathers and reduce-scatters, seconds (part of forward_s + backward_s)")


class StepTiming(Frozen):
    step: int = Field(ge=1, description="step number, from 1")
    step_s: float = Field(gt=0, allow_inf_nan=False, description="schedule (micro-batches) + gradient sync, "
                                                                  "slowest rank")
    wall_s: float = Field(gt=0, allow_inf_nan=False, description="the whole step on rank 0 (optimizer included)")
    stages: tuple[StageTiming, ...] = Field(default=(), description="layered: per stage, in plan order")
    members: tuple[MemberTiming, ...] = Field(default=(), description="sequence: per member, in plan order")


TIMINGS = ("stages", "members")  # StepTiming's per-part fields: each plan kind's runs fill one (PlanKind.timings)


def cluster_hash(cluster: Cluster) -> str:
    return hashlib.sha256(cluster.model_dump_json().encode()).hexdigest()


class RunLog(Frozen):
    format: Literal["hexiscale.runlog/1"] = Field(default=RUNLOG_FORMAT, description="file format tag")
    problem: str = Field(description="name of the problem the run was made for")
    problem_hash: str = Field(min_length=64, max_length=64, description="sha256 of that problem")
    cluster_hash: str = Field(min_length=64, max_length=64, description="sha256 of the cluster")
    run_problem: Problem = Field(description="the problem as run: cluster, model trained, run settings")
    plan: AnyPlan = Field(description="the plan that ran (a sequence plan as scaled to the model run)")
    steps: tuple[StepTiming, ...] = Field(min_length=1, description="every step, in order")

    @model_validator(mode="after")
    def _consistent(self) -> RunLog:
        if cluster_hash(self.run_problem.cluster) != self.cluster_hash:
            raise ValueError("cluster_hash does not match the cluster the log carries (edited or corrupted)")
        kind = kind_of(self.plan)  # its steps time the plan's parts in their field `kind.timings`
        expected = kind.timed_parts(self.plan)
        for step in self.steps:
            others = [name for name in TIMINGS if name != kind.timings and getattr(step, name)]
            if others or [kind.timing_key(t) for t in getattr(step, kind.timings)] != expected:
                raise ValueError(f"step {step.step} lists {kind.timings} that are not the plan's")
        return self

    def record(self, source: str, warmup: int = WARMUP_STEPS, statistic: Statistic = "mean") -> RunRecord:
        """The `statistic` (mean, median or fastest) over the steps after `warmup` (all steps if
        there are no more): per unit (each stage; each replica's slowest member) the forward +
        backward per micro-batch, the step time, and per micro-batch each stage's TP
        collectives, or each replica's HP all-to-alls and ZeRO-3 collectives."""
        steps = after_warmup(self.steps, warmup)
        step_s = summarize([s.step_s for s in steps], statistic)
        kind = kind_of(self.plan)  # each step's timings as per-unit rows (PlanKind.step_rows)
        rows = [kind.step_rows(self.run_problem, self.plan, getattr(s, kind.timings)) for s in steps]
        columns = {field: _columns(np.array([r[field] for r in rows]), statistic) for field in rows[0]}
        return RunRecord(problem=self.run_problem, plan=self.plan, step_s=step_s, source=source, **columns)


def _columns(rows: np.ndarray, statistic: Statistic) -> tuple[float, ...]:
    """The `statistic` of each column of [steps × units]."""
    return tuple(summarize(rows[:, i], statistic) for i in range(rows.shape[1]))


def run_problem(problem: Problem, model, config) -> Problem:
    """`problem` as a run executes it: the model trained and the run's own settings (a
    sequence run: the plan as scaled to them, see `runtime.sequence.job`)."""
    training = TrainingSpec(**{**problem.training.model_dump(), "seq_len": config.seq_len,
                               "micro_batch": config.micro_batch, "recompute": config.recompute,
                               "schedule": config.schedule})
    return Problem(name=problem.name, cluster=problem.cluster, model=model, training=training)


def make_run_log(problem: Problem, problem_sha256: str, plan, config, steps: list[dict]) -> RunLog:
    """The run log of a finished run of either kind: `steps` are its metrics' step records."""
    timed = [StepTiming(step=s["step"], step_s=s["step_s"], wall_s=s["wall_s"],
                        stages=tuple(StageTiming(**{k: st[k] for k in StageTiming.model_fields if k in st})
                                     for st in s.get("stages", ())),
                        members=tuple(MemberTiming(**{k: m[k] for k in MemberTiming.model_fields if k in m})
                                      for m in s.get("members", ())))
             for s in steps]
    return RunLog(problem=problem.name, problem_hash=problem_sha256, cluster_hash=cluster_hash(problem.cluster),
                  run_problem=run_problem(problem, config.model, config), plan=plan, steps=tuple(timed))


def write_run_log(out_dir: str | Path, log: RunLog) -> Path:
    """Write `runlog.json` through a temporary file renamed over it: a reader (`calibrate` on a
    folder another machine fills, say) sees the old log or the whole new one, never half."""
    return write_atomically(Path(out_dir) / RUNLOG_FILE, log.model_dump_json(indent=1) + "\n")


def read_run_log(path: str | Path) -> RunLog:
    """Parse a run log; ValueError (json or validation) for a truncated or corrupted file."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != RUNLOG_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"not a run log: format is {found!r}, expected {RUNLOG_FORMAT!r}")
    return RunLog.model_validate(data)


def finished_steps(out_dir: str | Path) -> list[dict]:
    """The step records rank 0 wrote into `out_dir/metrics.json` once every step was done
    ([] when there is none: a run that failed, or another machine's folder)."""
    path = Path(out_dir) / METRICS_FILE
    return json.loads(path.read_text())["steps"] if path.is_file() else []


def log_finished_job(job) -> Path | None:
    """The run log of a finished run written by its rank 0 from the job alone: a --torchrun run
    has no launcher that gathers the machines' results, and only rank 0's out folder holds the
    steps. None for a job without a problem (made before jobs carried one, or by hand), without
    an out_dir, or without finished steps. OSError or ValueError if the folder cannot be read or
    written."""
    if job.problem is None or not job.config.out_dir:
        return None
    steps = finished_steps(job.config.out_dir)
    if not steps:
        return None
    log = make_run_log(job.problem, job.problem_hash, job.plan, job.config, steps)
    return write_run_log(job.config.out_dir, log)


def log_run(problem: Problem, job, result) -> Path | None:
    """Write the run log of a finished run into its out_dir (None for a run without steps or
    without an out_dir)."""
    if not result.steps or not result.out_dir:
        return None
    log = make_run_log(problem, job.problem_hash, job.plan, job.config, result.steps)
    return write_run_log(result.out_dir, log)
