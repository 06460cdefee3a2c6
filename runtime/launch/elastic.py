"""Elastic runs (docs/checkpoints.md §10): when a rank dies, end the others, re-plan on the survivors,
restart from the last checkpoint under the new plan, and go on to the requested steps.

The re-planning itself is the caller's (`hexiscale run --elastic` passes `solvers.replan`):
the runtime never imports a solver. A rank counts as a lost device when its process died by
a signal the launcher did not send (SIGKILL, a crash); a rank that exits with an error of
its own (a bad setting, a bug) is not a lost device, and the run fails as before. Each
attempt has its own folder (`attempt-N`) for the job file and logs; each event is logged,
with the old and the new plan's T, kept in `RunResult`-like `ElasticResult.events` and
written to `elastic.jsonl` beside the attempts (an earlier run's file there is removed first,
and said: its events are not this run's).

Any plan kind: the loop maps lost ranks to devices by the kind's rank order
(`RuntimeKind.devices`) and re-plans the problem's plan, which a sequence job does not carry
(its plan is scaled to the tiny model and sequence, runtime/sequence/job.py): the caller
passes it as `plan`. Each restart makes the new plan's job with the same model and sequence
(a sequence plan is scaled to them again), so the re-planner must return a plan that can run
them (`hexiscale run --elastic` asks `solvers.replan` for one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.base import format_seconds
from planner.kinds import kind_of
from planner.problem import Problem
from runtime.checkpoints.manifest import complete_steps
from runtime.config import Job
from runtime.errors import RunError
from runtime.failure import FailureInjection
from runtime.kinds import runtime_kind
from runtime.launch.launcher import RunResult, launch_local, make_job
from runtime.launch.resume import resume_job
from planner.base import plural

# (problem, plan, lost device ids of that problem) → (new problem, new plan, old T, new T)
Replanner = Callable[[Problem, Any, list[int]], tuple[Problem, Any, float | None, float]]
# (job of one attempt, failure to inject or None) → (its result, the ranks lost in it): where the
# attempt runs (default: local processes; runtime.testbed.runs: one command per emulated machine)
Launch = Callable[[Job, FailureInjection | None], tuple[RunResult, list[int]]]
MAX_RESTARTS = 4
ELASTIC_LOG = "elastic.jsonl"


@dataclass
class ElasticEvent:
    attempt: int
    lost: list[int]  # device ids in the problem of the attempt that lost them
    resumed_step: int
    old_s: float | None
    new_s: float
    devices_before: int
    devices_after: int

    def line(self) -> str:
        old = format_seconds(self.old_s) if self.old_s is not None else "?"
        return (f"elastic: lost device{'s' if len(self.lost) > 1 else ''} {', '.join(map(str, self.lost))}; "
                f"re-planned {self.devices_before} → {plural(self.devices_after, 'device')}, T {old} → "
                f"{format_seconds(self.new_s)}; resuming at step {self.resumed_step}")


@dataclass
class ElasticResult:
    result: RunResult  # the last attempt's
    steps: list[dict]  # every step once: those before each restart's checkpoint, then the redone ones
    events: list[ElasticEvent] = field(default_factory=list)
    problem: Problem | None = None  # the problem and plan (the problem's, not scaled) the run ended on
    plan: Any = None


def attempts_folder(job: Job) -> Path:
    """Where the attempts' folders and elastic.jsonl go: the run's out_dir, else `runs` under
    its checkpoint folder."""
    return Path(job.config.out_dir or Path(job.config.checkpoint_dir) / "runs")


def attempt_folders(base: Path) -> list[Path]:
    """An elastic run's attempt-N folders under `base`, in order (none for any other folder)."""
    found = [(int(p.name.split("-", 1)[1]), p) for p in base.glob("attempt-*")
             if p.is_dir() and p.name.split("-", 1)[1].isdigit()] if base.is_dir() else []
    return [p for _, p in sorted(found)]


def elastic_folder_refusal(base: Path) -> str:
    """Where a command given an elastic run's --out folder wants one run's (each attempt ran one
    plan): which they are ('' when `base` holds none). The last holds the whole run's loss curve."""
    attempts = attempt_folders(base)
    if not attempts:
        return ""
    return (f"{base} is an --elastic run's folder, each of its attempts a run of one plan: give one of "
            f"{', '.join(str(p) for p in attempts)} (the last holds the whole run's loss curve, loss.png)")


def fresh_event_log(base: Path, log: Callable[[str], None]) -> Path:
    """This run's elastic.jsonl: one an earlier run left there is removed (and said), so that
    the file holds this run's events only rather than both runs' appended."""
    path = base / ELASTIC_LOG
    if path.is_file():
        path.unlink()
        log(f"note: removed {path}, an earlier elastic run's events (this run writes its own there)")
    return path


def lost_ranks(result: RunResult) -> list[int]:
    """Ranks whose process died by a signal the launcher did not send."""
    return [r for r, code in enumerate(result.returncodes)
            if code is not None and code < 0 and r not in result.killed]


def restart_job(job: Job, problem: Problem, plan: Any) -> tuple[Job, int]:
    """The job of `plan` (of `problem`) with the same model and settings, from the newest
    checkpoint (step 0 when there is none yet)."""
    scheduled = kind_of(job.plan).pipeline_schedule  # a plan without a pipeline schedule refuses one
    dropped = {"model", "out_dir", "resume_from", "dump_params"} | (set() if scheduled else {"schedule"})
    settings = job.config.model_dump(exclude=dropped)
    settings["dump_params"] = job.config.dump_params
    new = make_job(problem, plan, job.config.model, **settings)
    if not complete_steps(job.config.checkpoint_dir):
        return new, 0
    new, manifest = resume_job(new, job.config.checkpoint_dir)
    return new, manifest.step


def local_attempt(echo: bool) -> Launch:
    """Each attempt on local processes; a lost rank is one that died by a signal (`lost_ranks`)."""
    def launch(job: Job, failure: FailureInjection | None) -> tuple[RunResult, list[int]]:
        result = launch_local(job, echo=echo, failure=failure, end_others=True)
        return result, lost_ranks(result)

    return launch


def run_elastic(problem: Problem, job: Job, replanner: Replanner, *, plan: Any = None, echo: bool = True,
                failure: FailureInjection | None = None, log: Callable[[str], None] = print,
                max_restarts: int = MAX_RESTARTS, launch: Launch | None = None) -> ElasticResult:
    """Run `job` (made for `problem` from `plan`; default: the job's own plan, which is the
    problem's for a layered job) to its steps, re-planning after each lost device.
    `failure` (tests only) strikes in the first attempt. `launch` runs each attempt (default:
    local processes)."""
    launch = launch or local_attempt(echo)
    plan = job.plan if plan is None else plan
    if not job.config.checkpoint_dir or not job.config.save_every:
        raise RunError("an elastic run needs checkpoints: set a checkpoint folder and save_every")
    base = attempts_folder(job)
    events_file = fresh_event_log(base, log)
    steps: dict[int, dict] = {}
    events: list[ElasticEvent] = []
    for attempt in range(max_restarts + 1):
        config = job.config.model_copy(update={"out_dir": str(base / f"attempt-{attempt}")})
        result, lost = launch(job.model_copy(update={"config": config}), failure if attempt == 0 else None)
        steps.update({s["step"]: s for s in result.steps})
        if result.ok:
            return ElasticResult(result, [steps[k] for k in sorted(steps)], events, problem, plan)
        if not lost or attempt == max_restarts:
            raise RunError(f"the run failed (logs in {config.out_dir}):\n" + result.failure_summary())
        devices = runtime_kind(job.kind).devices(job.plan)  # rank order (a scaled plan keeps its devices)
        new_problem, new_plan, old_s, new_s = replanner(problem, plan, [devices[r] for r in lost])
        job, resumed = restart_job(job, new_problem, new_plan)
        steps = {k: v for k, v in steps.items() if k <= resumed}
        events.append(ElasticEvent(attempt, [devices[r] for r in lost], resumed, old_s, new_s,
                                   len(devices), len(runtime_kind(job.kind).devices(new_plan))))
        log(events[-1].line())
        with events_file.open("a") as handle:
            handle.write(json.dumps(events[-1].__dict__) + "\n")
        problem, plan = new_problem, new_plan
    raise AssertionError("unreachable")
