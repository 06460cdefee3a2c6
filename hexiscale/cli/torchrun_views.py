"""`hexiscale run --torchrun`: write the job file and print one command per machine, with what
those commands need on real machines said above them (docs/testbed.md, issue 32): the master
address (asked for, or the first machine's name), the interface each machine binds, the
bound on the rendezvous and start-up, that a checkpoint folder is one folder every
machine shares, and which machine's out folder gets the steps and the run log."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from hexiscale.cli.app import console, fail
from runtime.launch.commands import rank0_machine, torchrun_commands, used_machines
from runtime.launch.launcher import free_port
from runtime.metrics.runlog import RUNLOG_FILE
from runtime.testbed.layout import is_host_name


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


def shared_folders_note(config) -> str | None:
    """Every machine's ranks write their files of a checkpoint into its partial folder, which
    rank 0 then commits (runtime/checkpoints/manifest.py), and every rank reads the one
    resumed: on separate disks machine 0 would commit only its own ranks' files."""
    folders = [f for f in (f"--checkpoint-dir {config.checkpoint_dir}" if config.checkpoint_dir else "",
                           f"the resumed checkpoint {config.resume_from}" if config.resume_from else "") if f]
    if not folders:
        return None
    return (f"{' and '.join(folders)} must {'each ' if len(folders) > 1 else ''}be one folder shared by every "
            f"machine, at the same path on each (e.g. NFS): rank 0 commits each checkpoint from the files every "
            f"machine's ranks write there, and every rank reads the one resumed")


def run_log_note(job, cluster) -> str:
    """Where the run's steps and run log land: only in the out folder of the machine that holds
    rank 0 (runtime/launch/worker.py), which is the folder `hexiscale calibrate` takes."""
    name = cluster.machines[rank0_machine(job.plan, cluster)].name
    if not job.config.out_dir:
        return (f"without --out the ranks write no steps and no run log: with --out DIR, machine {name} (rank 0's) "
                f"writes them into DIR, and `hexiscale calibrate` reads DIR/{RUNLOG_FILE} there")
    return (f"machine {name} holds rank 0: the steps and, once the run has done them, the run log {RUNLOG_FILE} "
            f"that `hexiscale calibrate` reads go into {job.config.out_dir} on that machine, not on the others")


def write_job_file(job, out: Path | None, describe_job) -> Path:
    """The job file in --out, or in ./.hexiscale-run, where the previous call's is replaced: said,
    since commands printed for that one now run this job."""
    folder = out or Path(".hexiscale-run")
    folder.mkdir(parents=True, exist_ok=True)
    job_path = folder / "job.json"
    replaced = out is None and job_path.is_file()
    job_path.write_text(job.model_dump_json())
    console.print(f"wrote the job file {job_path}: {describe_job(job)}", highlight=False, soft_wrap=True, markup=False)
    if replaced:
        console.print(f"note: it replaced the job file an earlier --torchrun wrote there: commands printed for that "
                      f"job now run this one (--out DIR keeps a job apart)", highlight=False, soft_wrap=True)
    return job_path


def print_torchrun(job, prob, the_plan, master_addr: str | None, ifname: str | None, out: Path | None,
                   describe_job) -> None:
    """Write the job file and print it and one command per machine; nothing runs here."""
    machines = used_machines(the_plan, prob.cluster)
    first = prob.cluster.machines[machines[0][0]].name
    if master_addr is None and not is_host_name(first):  # e.g. "a b", "0" (which is 0.0.0.0), "box_1"
        fail(f"--master-addr: the first machine's name {first!r} is no host name another machine could resolve: "
             f"give its address or host name (--master-addr ADDRESS)")
    job_path = write_job_file(job, out, describe_job)
    master, note = master_note(master_addr, first, len(machines))
    timeout = job.config.timeout_s
    for line in (note, interface_note(master, ifname),
                 f"the rendezvous and start-up wait at most --timeout {timeout:g} s (torchrun's own default: 600 s); "
                 f"a failure is one `error:` line per process (the agent is torchrun's, wrapped: "
                 f"runtime/launch/torchrun.py)", shared_folders_note(job.config), run_log_note(job, prob.cluster),
                 "copy the job file to the same path on every machine and run there, from a folder where "
                 "`runtime` imports, one line per machine:"):
        if line is not None:
            console.print(line, highlight=False, soft_wrap=True, markup=False)  # lines name folders as written
    for command in torchrun_commands(str(job_path), the_plan, prob, master, free_port(), timeout, ifname,
                                     job.config.backend):
        console.print(command, highlight=False, soft_wrap=True)
