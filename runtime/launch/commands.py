"""The command each machine runs for a run across machines (`hexiscale run --torchrun`; the
emulated cluster's tests run them unchanged; no torch).

One line per machine the plan uses: `python -m runtime.launch.torchrun` — torchrun's own agent
with its own arguments, wrapped to pick the interface toward the master, bound the rendezvous by
the run's timeout and fail in one line (runtime/launch/torchrun.py) — starting
`runtime.launch.worker JOB --machine I` on each of the machine's used devices. Workers join
through the agent's store at master:port (env:// rendezvous): no second port.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from planner.hardware import Cluster
from planner.problem import Problem
from runtime.kinds import runtime_of
from runtime.launch.netif import IFNAME_VARS

TORCH_BUILDS = {"nvidia": "a CUDA build of torch (backend nccl inside the vendor)",
                "amd": "a ROCm build of torch (backend nccl, which is RCCL there, inside the vendor)",
                "other": "a torch build for its GPUs (vendor unknown: never bridged)"}


@dataclass(frozen=True)
class MachineCommand:
    machine: int  # index in the problem's cluster
    name: str  # the machine's name there
    node: int  # torchrun's node rank
    ranks: int  # processes on it (its used devices)
    argv: tuple[str, ...]  # from "python" on
    env: dict[str, str] = field(default_factory=dict)  # set before the command (an interface asked for)

    def line(self) -> str:
        assignments = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*assignments, shlex.join(self.argv)])


def used_machines(plan: Any, cluster: Cluster) -> list[tuple[int, int]]:
    """(machine, used devices on it) for every machine the plan uses, in cluster order."""
    used = set(runtime_of(plan).devices(plan))
    counts = [(m, len(used & set(cluster.devices_of(m)))) for m in range(len(cluster.machines))]
    return [(m, n) for m, n in counts if n]


def rank0_machine(plan: Any, cluster: Cluster) -> int:
    """The machine whose processes include rank 0: the one whose out folder gets the run's
    steps and, once they are done, its run log (runtime/launch/worker.py)."""
    return int(cluster.machine_of_device[runtime_of(plan).devices(plan)[0]])


def machine_commands(job_path: str, plan: Any, cluster: Cluster, master_addr: str, port: int, timeout_s: float,
                     ifname: str | None = None, python: str = "python") -> list[MachineCommand]:
    """The command of each machine the plan uses. `timeout_s` bounds the rendezvous (torchrun's
    `--rdzv-conf=timeout`); `ifname`: the interface every machine binds (else each picks the one
    that routes to `master_addr`)."""
    machines = used_machines(plan, cluster)
    env = {var: ifname for var in IFNAME_VARS} if ifname else {}
    return [MachineCommand(machine, cluster.machines[machine].name, node, ranks, (
        python, "-m", "runtime.launch.torchrun", f"--nnodes={len(machines)}", f"--node-rank={node}",
        f"--nproc-per-node={ranks}", f"--master-addr={master_addr}", f"--master-port={port}",
        f"--rdzv-conf=timeout={math.ceil(timeout_s)}", "-m", "runtime.launch.worker", job_path,
        "--machine", str(machine)), env) for node, (machine, ranks) in enumerate(machines)]


def torchrun_commands(job_path: str, plan: Any, problem: Problem, master_addr: str, port: int,
                      timeout_s: float = 60.0, ifname: str | None = None, backend: str = "nccl") -> list[str]:
    """Each machine's command line after a `#` line naming the torch build it needs for the
    job's `backend` (docs/vendors.md §8: under nccl CUDA on nvidia, ROCm on amd; gloo runs on
    the CPU); run each on its machine, from a folder where `runtime` imports."""
    lines = []
    for command in machine_commands(job_path, plan, problem.cluster, master_addr, port, timeout_s, ifname):
        lines += [torch_build_note(problem.cluster, command.machine, backend), command.line()]
    return lines


def torch_build_note(cluster, machine: int, backend: str = "nccl") -> str:
    """The `#` line before a machine's command: which torch build it needs. A gloo job trains
    on the CPU (runtime/launch/worker.py `rank_device`), so its GPUs' vendor asks for none."""
    vendor = cluster.gpu_of(machine).vendor.value
    head = f"# machine {cluster.machines[machine].name} ({vendor}): "
    if backend != "nccl":
        return head + f"any torch build (backend {backend}: the ranks train on the CPU, not the GPUs)"
    bridge = "; traffic to the other vendor goes over gloo in host memory" if cluster.mixes_vendors else ""
    return head + TORCH_BUILDS[vendor] + bridge
