"""Starting a run: one local process per used device (gloo), or torchrun commands for
several machines; `run_plan` is the public entry point. Both dispatch on the plan's kind
(`runtime.kinds`): the kind makes the job and says which devices get a process.

The local launcher watches its children: once one has failed, the others get the
collective timeout plus a grace period to notice and exit on their own (each prints why);
any still alive after that is killed, so a run always ends in bounded time.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.context
import os
import signal
import socket
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from typing import Any

from planner.problem import Problem
from planner.workload import ModelSpec
from runtime.checkpoints.hf_names import check_weights
from runtime.config import Job
from runtime.errors import RunError
from runtime.failure import FailureInjection
from runtime.host import too_many_ranks
from runtime.kinds import runtime_kind, runtime_of
from runtime.launch.commands import torchrun_commands  # noqa: F401 - re-exported (hexiscale run --torchrun)
from runtime.launch.resume import check_fresh_dir, resume_job
from runtime.metrics.runlog import log_run
from runtime.model.catalogue import model_tensors
from runtime.model.corpora import with_corpora

GRACE_S = 15.0
__all__ = ["GRACE_S", "MODELS", "RunError", "RunResult", "checked_model", "free_port", "launch_local",
           "local_ranks_refusal", "make_job", "run_plan", "torchrun_commands"]
# what `model` names (run_plan, make_job, `hexiscale run --model`): the tiny model, or the problem's own
MODELS = ("tiny", "problem")


@dataclass
class RunResult:
    returncodes: list[int]
    logs: list[str]
    wall_s: float
    exit_s: list[float] = field(default_factory=list)  # each rank's exit, seconds after launch
    killed: list[int] = field(default_factory=list)  # ranks the launcher had to kill
    steps: list[dict] = field(default_factory=list)
    replicas_identical: bool | None = None
    out_dir: str = ""

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)

    def failure_summary(self) -> str:
        lines = []
        for rank, (code, log) in enumerate(zip(self.returncodes, self.logs)):
            if code != 0:
                errors = [ln for ln in log.splitlines() if ln.startswith("error:")]
                how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
                if rank in self.killed:
                    how = "did not exit within the timeout after a failure; killed by the launcher"
                lines.append(errors[-1] if errors else f"rank {rank}: {how}")
        return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# What the forkserver imports once, so that no rank imports it again: the worker (torch) and
# torch._dynamo, which torch imports on a rank's first optimizer (`torch._compile._disable_dynamo`)
# with sympy and torch.distributed.tensor: one second of one core per rank, more than each rank's
# training in most test runs (sampled over `make test`: 400 of the ranks' 580 CPU-seconds).
# (runtime.launch.forkserver_quiet first: the forkserver ignores a Ctrl-C while it imports)
FORKSERVER_PRELOAD = ["runtime.launch.forkserver_quiet", "runtime.launch.worker", "torch._dynamo"]


def _context() -> multiprocessing.context.BaseContext:
    """A forkserver that has imported what a rank needs once: later starts are plain forks."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


@contextlib.contextmanager
def _main_hidden():
    """Hide the caller's `__main__` from multiprocessing while workers start.

    A forkserver (like spawn) re-imports the main script in the server and in each child,
    so a script that calls `run_plan` without an `if __name__ == "__main__":` guard would
    run again there and fail. The workers need nothing from `__main__` (their target lives
    in `runtime.launch.worker`), so for the start a bare module stands in for it. This swaps a
    process-wide entry for a moment: do not start other multiprocessing children from
    another thread at the same time."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _spawn(job_path: Path, world: int, out: Path, threads: int, echo_rank0: bool,
           failure: FailureInjection | None) -> list:
    env = {"MASTER_ADDR": "127.0.0.1", "HEXISCALE_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world),  # every rank on this host (runtime.communication.communicator.waits_awake)
           "HEXISCALE_LAUNCHER_PID": str(os.getpid())}  # workers end when this process does
    ctx, procs = _context(), []
    with _main_hidden():
        for rank in range(world):
            procs.append(_start_rank(ctx, rank, env, job_path, out, threads, echo_rank0, failure))
    return procs


def _rank_entry(*args) -> None:
    """The processes' target. Here, not `worker.spawned_entry` itself, so that this process never
    imports torch (two seconds): pickling a target takes the function object, and the forkserver
    has imported the worker already, so in a rank the import below is free."""
    from runtime.launch.worker import spawned_entry

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as before the forkserver's (forkserver_quiet)
    spawned_entry(*args)


def _start_rank(ctx, rank: int, env: dict[str, str], job_path: Path, out: Path, threads: int,
                echo_rank0: bool, failure: FailureInjection | None):
    rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
    if failure is not None and failure.rank == rank:
        rank_env.update(failure.env())
    proc = ctx.Process(target=_rank_entry, daemon=True,
                       args=(str(job_path), rank_env, str(out / f"rank{rank}.log"), rank == 0 and echo_rank0, threads))
    try:
        proc.start()
    except OSError as exc:  # the forkserver's socket lives in the temporary folder (107 characters at most)
        if "AF_UNIX path too long" not in str(exc):
            raise
        folder = tempfile.gettempdir()
        raise RunError(f"the temporary folder {folder} ({len(folder)} characters) is too long a path for the "
                       f"processes' Unix socket (under it: pymp-…/listener-…, 107 characters at most): set "
                       f"TMPDIR to a shorter folder") from exc
    return proc


def _wait(procs: list, bound_s: float, start: float) -> tuple[list[float], list[int]]:
    """Wait for every child; `bound_s` after the first failure, kill whatever is left.
    Returns each child's exit time (seconds after `start`, to the polling interval) and
    the ranks killed."""
    deadline, exits, killed = None, [0.0] * len(procs), []
    while any(p.is_alive() for p in procs):
        for rank, p in enumerate(procs):
            if not exits[rank] and not p.is_alive():
                exits[rank] = time.monotonic() - start
        if deadline is None and any(p.exitcode not in (None, 0) for p in procs):
            deadline = time.monotonic() + bound_s
        if deadline is not None and time.monotonic() > deadline:
            for rank, p in enumerate(procs):
                if p.is_alive() and rank not in killed:  # a killed child may take a moment to go
                    p.kill()
                    killed.append(rank)
        time.sleep(0.1)
    for rank, p in enumerate(procs):
        p.join()
        exits[rank] = exits[rank] or time.monotonic() - start
    return exits, killed


def launch_local(job: Job, threads: int = 1, echo: bool = True, world_size: int | None = None,
                 grace_s: float = GRACE_S, failure: FailureInjection | None = None,
                 end_others: bool = False) -> RunResult:
    """Run `job` with one process per rank on this machine; collect codes, logs, metrics.
    `world_size` overrides the number of processes (the plan's by default) — what a
    misconfigured torchrun would do; the workers then refuse to start. After a failure,
    ranks get the collective timeout plus `grace_s` to end on their own (`end_others`: none,
    the launcher ends them at once). `failure` (tests only) makes one rank die or hang."""
    world = world_size or runtime_kind(job.kind).world_size(job.plan)
    if job.config.backend == "gloo" and (refusal := local_ranks_refusal(world)) is not None:
        raise RunError(refusal)  # before any process starts or any file is written
    out = Path(job.config.out_dir) if job.config.out_dir else Path(tempfile.mkdtemp(prefix="hexiscale-run-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "steps.jsonl").unlink(missing_ok=True)
    job = job.model_copy(update={"config": job.config.model_copy(update={"out_dir": str(out)})})
    job_path = out / "job.json"
    job_path.write_text(job.model_dump_json())
    start = time.monotonic()
    procs = _spawn(job_path, world, out, threads, echo, failure)
    exits, killed = _wait(procs, 0.0 if end_others else job.config.timeout_s + grace_s, start)
    result = RunResult(returncodes=[p.exitcode for p in procs], exit_s=exits, killed=killed,
                       logs=[(out / f"rank{r}.log").read_text() for r in range(world)],
                       wall_s=time.monotonic() - start, out_dir=str(out))
    metrics, steps = out / "metrics.json", out / "steps.jsonl"
    if result.ok and metrics.is_file():
        data = json.loads(metrics.read_text())
        result.steps, result.replicas_identical = data["steps"], data["replicas_identical"]
    elif steps.is_file():  # the steps done before the failure, as rank 0 wrote them
        result.steps = [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]
    return result


def local_ranks_refusal(processes: int) -> str | None:
    """Why this host starts no local gloo run of `processes` processes (past MAX_RANKS_PER_CORE
    per core: each a Python process with torch), or None. `hexiscale run` says it too, earlier."""
    why = too_many_ranks(processes)
    if why is None:
        return None
    return f"the plan uses {processes} devices, one process each: {why}; run it across machines (--torchrun)"


def checked_model(model: Any) -> str | ModelSpec:
    """`model` as make_job takes it: 'tiny', 'problem' or a ModelSpec (a checkpoint's). Anything
    else is refused: a misspelt 'tyni' once trained the problem's full model (7B on CPU)."""
    if isinstance(model, ModelSpec) or (isinstance(model, str) and model in MODELS):
        return model
    raise RunError(f"model: expected 'tiny' (a small model of the plan's shape) or 'problem' (the problem's own "
                   f"model), got {model!r}")


def make_job(problem: Problem, plan: Any, model: str = "tiny", **settings) -> Job:
    """The job for `plan`, made by its kind's runtime: the plan checked against the problem,
    the model chosen (`tiny` or the problem's own), settings defaulting to the problem's
    training (the schedule that was priced is the one that runs). The job carries the problem:
    a --torchrun run's rank 0 writes the run log from it, having no launcher that knows it."""
    model = checked_model(model)
    kind = runtime_of(plan)
    job = kind.make_job(problem, plan, model, **settings)
    if job.config.precision not in kind.precisions:
        raise RunError(f"precision {job.config.precision}: {kind.name} plans run {' or '.join(kind.precisions)}")
    if job.config.init_from:  # before any process: a folder that is not this model is one line
        check_weights(job.config.init_from, job.config.model, model_tensors(job.config.model))
    return job


def run_plan(problem: Problem, plan: Any, model: str = "tiny", steps: int = 3, echo: bool = True,
             resume: str | Path | None = None, **settings) -> RunResult:
    """Train `plan` for `steps` steps on local processes; raise RunError if any rank fails.
    `data=PATH` / `eval_data=PATH` (with model='problem'): a text corpus tokenized as `hexiscale
    run --data` does (`runtime.model.corpora`; DataError names a bad one).
    `resume`: start from the newest complete checkpoint there, written under any plan
    (settings `checkpoint_dir` and `save_every` save them; CheckpointError names a bad file).

    Works from a plain script: no `if __name__ == "__main__":` guard is needed (the workers
    start from a forkserver that never re-imports the calling script). Each worker also
    ends if this process dies, even by SIGKILL."""
    settings = with_corpora(problem, checked_model(model), steps, settings)
    job, step = make_job(problem, plan, model, steps=steps, **settings), None
    if resume is not None:
        job, manifest = resume_job(job, resume)
        step = manifest.step
    check_fresh_dir(job, step)
    result = launch_local(job, echo=echo)
    if not result.ok:
        raise RunError("the run failed:\n" + result.failure_summary())
    log_run(problem, job, result)  # runlog.json: what `hexiscale calibrate` reads
    return result
