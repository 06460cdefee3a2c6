"""`python -m runtime.launch.torchrun TORCHRUN-ARGUMENTS`: torchrun's own agent
(`torch.distributed.run`, same arguments, same rendezvous) with what a run across real machines
needs and plain torchrun lacks (issue 32):

- the interface: before any rank starts, the ranks are told to bind the interface that routes
  to `--master-addr` (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, unless set), and the machine
  says which, in one line (`runtime.launch.netif`);
- bounded start-up: `hexiscale run --torchrun` passes `--rdzv-conf=timeout=T` (the run's
  `--timeout`; torchrun's static rendezvous waits 600 s by default, its dynamic one 900 s), so a
  master that never comes up ends every agent after T;
- one line per failure: every rank that fails prints one `error:` line (runtime.launch.worker);
  this agent adds one for its machine and exits 1, instead of torchrun's traceback and failure
  table; the ranks' C++ log lines (gloo's "[E… ProcessGroupGloo.cpp]") are off unless
  TORCH_CPP_LOG_LEVEL is set.
"""

from __future__ import annotations

import os
import sys
import tempfile

# before torch is imported, here and in the ranks this agent starts (they inherit them)
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
os.environ.setdefault("LOGLEVEL", "CRITICAL")  # torchelastic's own warnings and failure table

from runtime.launch.netif import InterfaceError, apply, choose_binding  # noqa: E402

EXIT_FAILED, EXIT_CONFIG = 1, 2


def machine_name(script_args: list[str]) -> str:
    """'machine NAME' from the worker's `JOB --machine I` (the job names the cluster's machines)."""
    if "--machine" not in script_args or not script_args:
        return "this machine"
    index = int(script_args[script_args.index("--machine") + 1])
    try:
        from runtime.config import Job

        job = Job.model_validate_json(open(script_args[0]).read())
        return f"machine {job.cluster.machines[index].name}"
    except (OSError, ValueError, IndexError, AttributeError):
        return f"machine {index}"


def one_line(exc: BaseException) -> str:
    """The first line of an exception, without C++ frames or torch's source prefixes."""
    from runtime.launch.worker import short_reason

    return short_reason(exc)


def failed_ranks(exc) -> str:
    codes = sorted((f.local_rank, f.exitcode) for f in exc.failures.values())
    return ", ".join(f"local rank {rank} exit {code}" for rank, code in codes)


def quiet_agent_logs() -> None:
    """torchelastic's loggers each set their own level when made (LOGLEVEL is read only by some):
    every one made so far goes to CRITICAL, unless LOGLEVEL asks for another."""
    import logging

    level = os.environ["LOGLEVEL"]
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("torch.distributed") and isinstance(logger, logging.Logger):
            logger.setLevel(level)


def run_agent(args, where: str) -> int:
    """torchrun's agent on `args`; one line and a non-zero code on any failure."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    quiet_agent_logs()
    try:
        # torchrun's own log folder (empty unless --redirects/--tee) is a fresh /tmp/torchelastic_*
        # per run, never removed: here it lives as long as the agent, unless the user named one
        with tempfile.TemporaryDirectory(prefix="torchelastic_") as logs:
            args.log_dir = args.log_dir or logs
            run(args)
    except ChildFailedError as exc:
        print(f"error: {where}: its ranks failed ({failed_ranks(exc)}); each said why above", file=sys.stderr,
              flush=True)
        return EXIT_FAILED
    except SignalException as exc:
        print(f"error: {where}: stopped by signal {exc.sigval.name}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - the rendezvous failed: one line, not torch's traceback
        print(f"error: {where}: no rendezvous with the master at {args.master_addr}:{args.master_port} "
              f"({one_line(exc)})", file=sys.stderr, flush=True)
        return EXIT_FAILED
    return 0


def main(argv: list[str]) -> int:
    from torch.distributed.run import parse_args

    args = parse_args(argv)
    where = machine_name(list(args.training_script_args))
    nodes = int(str(args.nnodes).split(":")[-1])
    try:
        binding = choose_binding(args.master_addr, nodes)
    except InterfaceError as exc:
        print(f"error: {where}: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    apply(binding)
    print(f"{where}: ranks bind {binding.interface} ({binding.address}), {binding.how}", file=sys.stderr, flush=True)
    return run_agent(args, where)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
