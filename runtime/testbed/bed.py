"""`Testbed`: an emulated cluster, up inside a `with` block and gone after it (docs/testbed.md).

    with Testbed(load_cluster("demo-4")) as bed:          # namespaces, links, shaping, hosts files
        proc = bed.start("r4090-0", ["torchrun", ...])     # a process inside machine r4090-0
        bed.link_down(1); bed.link_up(1); bed.set_rate(1, 40.0)

Teardown (`down`) kills every process started through the testbed (its whole process group)
and every other process inside its namespaces, deletes the namespaces (which takes their veth
pairs and shaping with them), the hosts folders and the temporary folder. It runs on leaving
the block for any reason — an exception, a failed assertion, SIGINT or SIGTERM (the handlers
tear down, then raise KeyboardInterrupt) — and at interpreter exit; `remove_leftovers(prefix)`
cleans what a process killed with SIGKILL left behind.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from planner.hardware import Cluster
from runtime.testbed import netns
from runtime.testbed.layout import MachineSlot, TestbedLayout, plan_layout
from runtime.testbed.netns import PREFIX, TestbedError, deferred_signals

STOP_S = 3.0  # SIGTERM, then this long before SIGKILL
PROBE_S = 2.0  # a machine that does not answer a TCP connect within this is unreachable
PROBE_PORT = 9  # discard: nothing listens there in a testbed's namespace
PROBE = f"""
import socket, sys
for address in sys.argv[2:]:
    try:
        socket.create_connection((address, {PROBE_PORT}), timeout=float(sys.argv[1])).close()
        print(address)
    except ConnectionRefusedError:
        print(address)
    except OSError:
        pass
"""


def new_prefix() -> str:
    """A prefix of its own per testbed, so that concurrent testbeds cannot collide."""
    return f"{PREFIX}{uuid.uuid4().hex[:6]}"


def in_namespace(slot: MachineSlot, argv: list[str]) -> list[str]:
    """`argv` run inside the machine's namespace with its own host name (a UTS namespace of its
    own): `ip netns exec` also mounts its hosts file over /etc/hosts."""
    return ["ip", "netns", "exec", slot.namespace, "unshare", "--uts", "--", "sh", "-c",
            'hostname "$0" && exec "$@"', slot.host_name, *argv]


class Testbed:
    """The emulated cluster of `cluster` (see module doc). `scale`: the one rate factor
    (None: `layout.fitting_scale`); `loopback_own_name`: each machine's hosts file maps its own
    name to 127.0.1.1 as Debian does; `prefix`: namespace names (default: a fresh one)."""

    __test__ = False

    def __init__(self, cluster: Cluster, scale: float | None = None, loopback_own_name: bool = False,
                 prefix: str | None = None):
        self.layout: TestbedLayout = plan_layout(cluster, prefix or new_prefix(), scale)
        self.loopback_own_name = loopback_own_name
        self.processes: list[subprocess.Popen] = []
        self.folder: Path | None = None
        self.removed: dict[str, list] = {}
        self._handlers: dict[int, object] = {}
        self._lock = threading.Lock()
        self._is_up = False

    # -- up and down ----------------------------------------------------------------------
    def up(self) -> Testbed:
        """Create everything; on any failure remove what was made and raise TestbedError."""
        reason = netns.unavailable_reason()
        if reason:
            raise TestbedError(reason)
        self._is_up = True
        atexit.register(self.down)
        try:
            self.folder = Path(tempfile.mkdtemp(prefix=f"{self.layout.prefix}-"))
            netns.build_hub(self.layout)
            for slot in self.layout.machines:
                netns.build_machine(self.layout, slot, self.loopback_own_name)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> dict[str, list]:
        """Remove everything this testbed made (idempotent); returns what was removed.
        SIGINT/SIGTERM wait until it is done, and the testbed counts as up until then: an
        interrupt or error half-way leaves the exit-time cleanup armed, never half a testbed."""
        with deferred_signals(), self._lock:
            if not self._is_up:
                return self.removed
            stopped = [p.pid for p in self.processes if p.poll() is None]
            for proc in self.processes:
                stop_group(proc)
            removed = netns.remove(list(self.layout.namespaces))
            removed["processes"] = sorted(set(removed["processes"]) | set(stopped))
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                removed["temp folders"] = [str(self.folder)]
            atexit.unregister(self.down)
            self.removed = removed
            self._is_up = False
            return removed

    def keep(self) -> TestbedLayout:
        """Leave the testbed up after this process (`hexiscale testbed up`): nothing is torn
        down at exit; `remove_leftovers(prefix)` removes it later. Its temporary folder goes now.
        Signals wait meanwhile: one arriving half-way would find the handlers still tearing
        down a testbed already marked kept, and report a teardown that did not happen."""
        with deferred_signals(), self._lock:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
            atexit.unregister(self.down)
            self._is_up = False
            self._restore_handlers()
        return self.layout

    def __enter__(self) -> Testbed:
        self._install_handlers()
        try:
            return self.up()
        except BaseException:
            self._restore_handlers()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore_handlers()

    def _install_handlers(self) -> None:
        """SIGINT and SIGTERM tear down first, then raise KeyboardInterrupt (main thread only:
        Python delivers signals there)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            self.down()
            raise KeyboardInterrupt(f"signal {signum}: the testbed was torn down")

        for signum in (signal.SIGINT, signal.SIGTERM):
            self._handlers[signum] = signal.signal(signum, handler)

    def _restore_handlers(self) -> None:
        for signum, previous in self._handlers.items():
            signal.signal(signum, previous)
        self._handlers.clear()

    # -- inside the machines --------------------------------------------------------------
    def slot(self, machine: int | str) -> MachineSlot:
        return self.layout.slot(machine)

    def address(self, machine: int | str) -> str:
        return self.slot(machine).address

    def command(self, machine: int | str, argv: list[str]) -> list[str]:
        """The full command line that runs `argv` inside the machine (what `up` prints)."""
        return in_namespace(self.slot(machine), list(argv))

    def start(self, machine: int | str, argv: list[str], **popen) -> subprocess.Popen:
        """Start `argv` inside the machine in a session of its own (stopped with its children
        at teardown); `popen`: subprocess.Popen's keywords (env, cwd, stdout, ...)."""
        if not self._is_up:
            raise TestbedError("the testbed is not up")
        proc = subprocess.Popen(self.command(machine, argv), start_new_session=True, **popen)
        self.processes.append(proc)
        return proc

    def run(self, machine: int | str, argv: list[str], timeout: float = 60.0, **popen) -> subprocess.CompletedProcess:
        """Run `argv` inside the machine to the end (stdout and stderr captured as text)."""
        proc = self.start(machine, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def stop_machine(self, machine: int | str) -> list[int]:
        """SIGKILL every process inside the machine (a machine whose processes all die)."""
        return netns.kill_namespace_processes([self.slot(machine).namespace])

    def reachable(self, machine: int | str, others: list[int | str], timeout_s: float = PROBE_S) -> set[str]:
        """The machines among `others` that `machine` reaches now over the testbed's network:
        a TCP connect to a port nobody listens on is refused at once by a machine that is
        there, and times out (or finds no route) across a cut link."""
        names = [self.slot(m).name for m in others]
        addresses = [self.slot(m).address for m in others]
        done = self.run(machine, [sys.executable, "-c", PROBE, str(timeout_s), *addresses], timeout=timeout_s * len(names) + 30)
        reached = set(done.stdout.split())
        return {name for name, address in zip(names, addresses) if address in reached}

    # -- the links ------------------------------------------------------------------------
    def link_down(self, machine: int | str) -> None:
        netns.set_link_state(self.layout, self.slot(machine).index, up=False)

    def link_up(self, machine: int | str) -> None:
        netns.set_link_state(self.layout, self.slot(machine).index, up=True)

    def set_rate(self, machine: int | str, mbit: float) -> None:
        """Shape the machine's link (both directions) to `mbit` Mbit/s from now on."""
        netns.set_link_rate(self.layout, self.slot(machine).index, mbit)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process's group, SIGKILL it STOP_S later if it is still there."""
    if proc.poll() is not None:
        return
    for signum, wait_s in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, STOP_S)):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def remove_leftovers(prefix: str = PREFIX) -> dict[str, list]:
    """Remove every namespace, hosts folder and temporary folder whose name starts with
    `prefix`, with the processes inside: what a testbed killed by SIGKILL, or `hexiscale
    testbed up`, left. Signals wait until it is done (a second Ctrl-C cannot cut it short)."""
    with deferred_signals():
        removed = netns.remove(netns.leftovers(prefix))
        folders = netns.temp_folders(prefix)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    removed["temp folders"] = folders
    return removed
