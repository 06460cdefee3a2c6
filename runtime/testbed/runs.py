"""Runs across the emulated cluster (docs/testbed.md §4): each machine the plan uses runs, inside
its namespace, the very command `hexiscale run --torchrun` prints for it (torchrun's agent,
wrapped: runtime/launch/torchrun.py), against the master at the first used machine's name.

`TestbedLaunch` is an elastic `Launch` (runtime.launch.elastic): it runs one attempt and says
which ranks were lost — every rank of a machine whose agent died by a signal nobody here sent
(its processes were killed), or that the first live machine no longer reaches over the network
(its link is down); when the two sides of a cut cannot tell who is cut off, the side that holds
the master stays. The attempt's processes get the run's timeout plus `grace_s` after the first
failure to end on their own, then they are killed (and said so), as the local launcher does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime.config import Job
from runtime.failure import FailureInjection
from runtime.kinds import runtime_kind
from runtime.launch.commands import MachineCommand, machine_commands
from runtime.launch.launcher import RunResult
from runtime.testbed.bed import Testbed, stop_group

PORT = 29500  # the master's store: every machine has a network namespace of its own
GRACE_S = 10.0
ROOT = Path(__file__).resolve().parents[2]  # where `runtime` imports


@dataclass
class Attempt:
    """One attempt's record, in monotonic seconds (tests compare them to when a fault struck)."""

    start: float
    machines: list[str]
    exits: dict[str, float] = field(default_factory=dict)
    killed: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


@dataclass
class TestbedLaunch:
    """Run attempts on `bed` (see module doc); `env`: added to every machine's environment."""

    __test__ = False

    bed: Testbed
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = GRACE_S
    attempts: list[Attempt] = field(default_factory=list)

    def __call__(self, job: Job, failure: FailureInjection | None = None) -> tuple[RunResult, list[int]]:
        if failure is not None:
            raise ValueError("failure injection runs local processes; on the testbed, cut links or kill machines")
        out = Path(job.config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "steps.jsonl").unlink(missing_ok=True)
        (out / "job.json").write_text(job.model_dump_json())
        commands = self.commands(job, out / "job.json")
        attempt = Attempt(time.monotonic(), [c.name for c in commands])
        self.attempts.append(attempt)
        procs = [self.start(c, out) for c in commands]
        self.wait(procs, attempt, job.config.timeout_s)
        result = collect(procs, attempt, out)
        lost = self.lost_machines(procs, attempt) if not result.ok else []
        attempt.lost = lost
        return result, lost_ranks(job, lost)

    def commands(self, job: Job, job_path: Path) -> list[MachineCommand]:
        cluster = job.cluster
        used = runtime_kind(job.kind).devices(job.plan)
        # its host name: the name itself where valid, else the one the hosts files carry
        master = self.bed.layout.machines[int(cluster.machine_of_device[min(used)])].host_name
        commands = machine_commands(str(job_path), job.plan, cluster, master, PORT, job.config.timeout_s,
                                    python=sys.executable)
        return sorted(commands, key=lambda c: c.node)

    def start(self, command: MachineCommand, out: Path) -> subprocess.Popen:
        log = open(out / f"{command.name}.log", "w")
        env = {**os.environ, "OMP_NUM_THREADS": "1", **command.env, **self.env}
        with log:
            return self.bed.start(command.name, list(command.argv), env=env, cwd=ROOT, stdout=log,
                                  stderr=subprocess.STDOUT)

    def wait(self, procs: list[subprocess.Popen], attempt: Attempt, timeout_s: float) -> None:
        """Until every machine's agent has exited; timeout + grace after the first failure, the
        rest are stopped (their whole process group)."""
        deadline = None
        while len(attempt.exits) < len(procs):
            for name, proc in zip(attempt.machines, procs):
                if name not in attempt.exits and proc.poll() is not None:
                    attempt.exits[name] = time.monotonic()
                    if proc.returncode != 0 and deadline is None:
                        deadline = time.monotonic() + timeout_s + self.grace_s
            if deadline is not None and time.monotonic() > deadline:
                for name, proc in zip(attempt.machines, procs):
                    if proc.poll() is None:
                        stop_group(proc)
                        attempt.killed.append(name)
            time.sleep(0.05)

    def lost_machines(self, procs: list[subprocess.Popen], attempt: Attempt) -> list[str]:
        """Machines whose agent died by a signal not sent here, and those the first live one
        does not reach (see module doc)."""
        dead = [n for n, p in zip(attempt.machines, procs) if p.returncode < 0 and n not in attempt.killed]
        live = [n for n in attempt.machines if n not in dead]
        if not live:
            return dead
        reached = self.bed.reachable(live[0], live[1:]) if live[1:] else set()
        return dead + [n for n in live[1:] if n not in reached]


def lost_ranks(job: Job, machines: list[str]) -> list[int]:
    """Every rank of the job that runs on one of `machines`."""
    cluster = job.cluster
    devices = runtime_kind(job.kind).devices(job.plan)  # rank order
    return [rank for rank, device in enumerate(devices)
            if cluster.machines[int(cluster.machine_of_device[device])].name in machines]


def collect(procs: list[subprocess.Popen], attempt: Attempt, out: Path) -> RunResult:
    """The attempt as a RunResult with one entry per machine (its agent's code and log)."""
    result = RunResult(returncodes=[p.returncode for p in procs],
                       logs=[(out / f"{name}.log").read_text() for name in attempt.machines],
                       wall_s=max(attempt.exits.values()) - attempt.start,
                       exit_s=[attempt.exits[n] - attempt.start for n in attempt.machines],
                       killed=[attempt.machines.index(n) for n in attempt.killed], out_dir=str(out))
    metrics, steps = out / "metrics.json", out / "steps.jsonl"
    if result.ok and metrics.is_file():
        data = json.loads(metrics.read_text())
        result.steps, result.replicas_identical = data["steps"], data["replicas_identical"]
    elif steps.is_file():
        result.steps = [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]
    return result
