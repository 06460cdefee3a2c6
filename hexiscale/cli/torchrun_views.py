"""`hexiscale run --torchrun`: write the job file and print one command per machine, with what
those commands need on real machines said above them (docs/testbed.md, issue 32): the master
address (asked for, or the first machine's name), the interface each machine binds, and the
bound on the rendezvous and start-up."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from hexiscale.cli.app import console
from runtime.launch.commands import torchrun_commands, used_machines
from runtime.launch.launcher import free_port


def is_loopback_literal(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def master_note(master_addr: str | None, first: str, machines: int) -> tuple[str, str]:
    """(the master address, the line that says where it comes from)."""
    if master_addr is None:
        return first, (f"master address {first}: the first machine's name in the cluster file (--master-addr not "
                       f"given); every machine must resolve it to an address the others reach, not to 127.0.1.1 as "
                       f"Debian and Ubuntu map a host's own name (--master-addr ADDRESS otherwise)")
    if machines > 1 and is_loopback_literal(master_addr):
        return master_addr, (f"note: --master-addr {master_addr} is a loopback address: these commands work only "
                             f"with every machine on this one host")
    return master_addr, f"master address {master_addr} (--master-addr)"


def interface_note(master: str, ifname: str | None) -> str:
    if ifname:
        return f"every machine's ranks bind {ifname} (GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, set in each line)"
    return (f"each machine's ranks bind the interface that routes to {master} (it sets GLOO_SOCKET_IFNAME and "
            f"NCCL_SOCKET_IFNAME unless set, and prints which; --ifname NAME chooses one for all)")


def print_torchrun(job, prob, the_plan, master_addr: str | None, ifname: str | None, out: Path | None,
                   describe_job) -> None:
    """Write the job file and print it and one command per machine; nothing runs here."""
    folder = out or Path(".hexiscale-run")
    folder.mkdir(parents=True, exist_ok=True)
    job_path = folder / "job.json"
    job_path.write_text(job.model_dump_json())
    console.print(f"wrote the job file {job_path}: {describe_job(job)}", highlight=False, soft_wrap=True)
    machines = used_machines(the_plan, prob.cluster)
    master, note = master_note(master_addr, prob.cluster.machines[machines[0][0]].name, len(machines))
    timeout = job.config.timeout_s
    for line in (note, interface_note(master, ifname),
                 f"the rendezvous and start-up wait at most --timeout {timeout:g} s (torchrun's own default: 600 s); "
                 f"a failure is one `error:` line per process (the agent is torchrun's, wrapped: "
                 f"runtime/launch/torchrun.py)",
                 "copy the job file to the same path on every machine and run there, from a folder where "
                 "`runtime` imports, one line per machine:"):
        console.print(line, highlight=False, soft_wrap=True)
    for command in torchrun_commands(str(job_path), the_plan, prob, master, free_port(), timeout, ifname):
        console.print(command, highlight=False, soft_wrap=True)
