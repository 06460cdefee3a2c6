"""Per-rank entry point: `python -m runtime.launch.worker JOB.json [--machine I]`.

Reads the job, picks the runtime of its plan kind (`runtime.kinds`), finds this process's
rank, joins the world through the communicator, trains the rank for the configured steps,
and leaves. Any failure — a bad configuration, a peer that died, a collective that timed
out — prints one line naming this rank and the cause, and ends the process with a non-zero
code at once, which in turn makes its peers' pending collectives fail fast: the run never
hangs. Under torchrun (`--machine I`) rank 0 ends a finished run by writing its run log.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

from runtime.communication.communicator import Communicator
from runtime.config import Job
from runtime.errors import ConfigError
from runtime.kinds import runtime_kind
from runtime.metrics.runlog import RUNLOG_FILE, log_finished_job

EXIT_FAILED, EXIT_CONFIG = 1, 2
PR_SET_PDEATHSIG = 1  # linux/prctl.h
LAUNCHER_PID_VAR = "HEXISCALE_LAUNCHER_PID"
WATCH_INTERVAL_S = 0.5


def die_with_parent() -> None:
    """Linux: the kernel kills this process (SIGKILL) when its parent dies — the local
    launcher's forkserver, or torchrun's agent. Elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def watch_launcher(pid: int) -> None:
    """A daemon thread that ends this process once the launcher `pid` is gone: the local
    launcher is not this process's parent (its forkserver is), so the parent-death signal
    alone would miss a launcher killed with SIGKILL while its forkserver lingers."""
    def watch() -> None:
        while process_alive(pid):
            time.sleep(WATCH_INTERVAL_S)
        print(f"error: the launcher (pid {pid}) is gone; stopping", file=sys.stderr, flush=True)
        os._exit(EXIT_FAILED)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def spawned_entry(job_path: str, env: dict[str, str], log_path: str, echo: bool, threads: int) -> None:
    """Entry of a process started by the local launcher (forked from a server that has
    already imported torch, so a start costs milliseconds, not an import)."""
    os.environ.update(env)
    torch.set_num_threads(threads)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 2)
    if not echo:
        os.dup2(log, 1)
    sys.exit(main([job_path]))


def short_reason(exc: BaseException) -> str:
    """One line: gloo's messages lose their source-file prefix and boilerplate advice."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = re.sub(r"^\[[^\]]*\.cc:\d+\]\s*", "", text).split(". This is typically")[0]
    if "by peer" in text:
        text = f"a peer process died or closed its connection: {text}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def rank_device(backend: str) -> torch.device:
    """CPU for gloo; under NCCL, `cuda:LOCAL_RANK` (made the current device)."""
    if backend != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return device


def run_rank(job: Job, kind_worker: ModuleType, rank: int, world_size: int) -> None:
    """Join the world, train this rank, leave the world. The local launcher names a port
    (HEXISCALE_PORT) whose store rank 0 hosts; under torchrun there is none and the rank
    joins through the store torchrun's agent already runs (env:// rendezvous)."""
    config = job.config
    comm = Communicator.start(config.backend, os.environ.get("MASTER_ADDR"), os.environ.get("HEXISCALE_PORT"),
                              rank, world_size, kind_worker.rank_places(job), config.timeout_s,
                              rank_device(config.backend), wait=config.wait)
    kind_worker.train(job, comm)
    comm.close()


def log_torchrun_run(job: Job, machine: int) -> int:
    """Under torchrun, rank 0 writes the run log `hexiscale calibrate` reads (the local launcher
    writes its own runs' logs): no process gathers the machines' results, and only this
    machine's out folder holds the steps. Says where; a log it cannot write is one line."""
    where = f"machine {job.cluster.machines[machine].name}" if job.cluster else f"machine {machine}"
    try:
        path = log_finished_job(job)
    except (OSError, ValueError) as exc:
        print(f"error: rank 0: {Path(job.config.out_dir) / RUNLOG_FILE}: the run log was not written "
              f"({short_reason(exc)})", file=sys.stderr, flush=True)
        return EXIT_FAILED
    if path is not None:
        print(f"run log: {path.resolve()} on {where} (for `hexiscale calibrate`)", flush=True)
    return 0


def main(argv: list[str]) -> int:
    die_with_parent()
    if os.environ.get(LAUNCHER_PID_VAR):
        watch_launcher(int(os.environ[LAUNCHER_PID_VAR]))
    job = Job.model_validate_json(Path(argv[0]).read_text())
    machine = int(argv[argv.index("--machine") + 1]) if "--machine" in argv else None
    kind_worker = runtime_kind(job.kind).worker_module()
    rank = kind_worker.plan_rank(job, machine)
    world_size = int(os.environ.get("HEXISCALE_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    where = f"rank {rank}"
    try:
        kind_worker.check_job(job, world_size)
        where = kind_worker.describe_rank(job, rank)
        run_rank(job, kind_worker, rank, world_size)
    except ConfigError as exc:
        print(f"error: {where}: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_CONFIG)
    except BaseException as exc:  # noqa: BLE001 - any failure must end this rank, not hang it
        print(f"error: {where}: stopping after a failure in the run ({short_reason(exc)})",
              file=sys.stderr, flush=True)
        os._exit(EXIT_FAILED)
    sys.stdout.flush()
    return log_torchrun_run(job, machine) if machine is not None and rank == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

