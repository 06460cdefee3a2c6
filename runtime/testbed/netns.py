"""The `ip` and `tc` commands that build and remove a testbed (docs/testbed.md); no torch.

Nothing here touches the root namespace's interfaces: every veth pair is created inside the
hub namespace with its other end put straight into the machine's namespace. Shaping is htb on
both ends of each machine's veth (egress of the machine's `eth0`: what it sends; egress of the
hub's end: what it receives), a root class at the machine's link rate and, under it, one class
per slower pair, chosen by the peer's address (u32 filter). This kernel has no netem: rates and
links going down can be emulated, delay and loss cannot.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from runtime.testbed.layout import BRIDGE, SUBNET, MachineSlot, TestbedLayout

PREFIX = "hxtb"  # every testbed's namespaces (and the host check's probe) start with it
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*
NETNS_RUN = Path("/var/run/netns")
LINK_CLASS, DEFAULT_CLASS, PAIR_CLASS_BASE = 1, 0x10, 0x100
# htb bucket: 2 ms at the class's rate, at least two full frames. A larger floor lets a slow link
# pass a whole step's messages at once (32 KiB at 1 Mbit/s hid a 20× rate cut); htb charges a
# GSO segment larger than the bucket against later sends, so the average rate still holds.
BURST_S = 0.002
MIN_BURST_BYTES = 2 * 1514
SUBNET_BITS = SUBNET.split("/")[1]


class TestbedError(RuntimeError):
    """An `ip`/`tc` command failed, or this host cannot build a testbed; the message is one line."""

    __test__ = False


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one command; a failure is one line naming it and its stderr. Signals wait for it to
    end: a handler tearing down while `ip netns add` still ran would miss the namespace it adds."""
    with deferred_signals():
        done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def namespaces() -> list[str]:
    """Every network namespace `ip netns` knows on this host."""
    return sorted(line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip())


@contextmanager
def deferred_signals():
    """SIGINT and SIGTERM held back for the block and delivered after it: a teardown, or a
    probe namespace's add-then-delete, cannot be cut short half-way (a second Ctrl-C during
    cleanup used to leave most namespaces). Two layers: the mask keeps new signals pending
    (and the `ip`/`tc` commands started inside inherit it, so a terminal's Ctrl-C to the
    process group does not kill them); a recording handler catches one the C level took just
    before the mask, which Python would otherwise run inside the block. Main thread only:
    Python runs handlers there, and only there may they be changed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held, caught = (signal.SIGINT, signal.SIGTERM), []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    previous = {}
    try:
        for signum in held:
            previous[signum] = signal.signal(signum, lambda number, frame: caught.append(number))
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # runs what was pending (the recorder) first
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)  # now to the handler the caller had


def unavailable_reason() -> str | None:
    """None when this host can build a testbed; else one line saying why not."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces, veth, tc); this process is not root"
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"the emulated cluster needs {' and '.join(missing)} (iproute2, util-linux), not found on PATH"
    # Named under PREFIX so that `down --all` finds it should this process be SIGKILLed between
    # the two commands; signals are held so that nothing else can leave it.
    probe = f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
    with deferred_signals():
        done = sh("ip", "netns", "add", probe, check=False)
        if done.returncode == 0:
            sh("ip", "netns", "del", probe, check=False)
    if done.returncode != 0:
        return f"this host cannot create network namespaces (`ip netns add` said: {done.stderr.strip()})"
    return None


def rate(mbit: float) -> str:
    return f"{mbit * 1000:.0f}kbit"


def burst(mbit: float) -> str:
    return f"{max(MIN_BURST_BYTES, int(mbit * 1e6 / 8 * BURST_S))}b"


def htb_class(ns: str, dev: str, parent: str, classid: str, mbit: float, verb: str = "add") -> None:
    sh("tc", "-n", ns, "class", verb, "dev", dev, "parent", parent, "classid", classid, "htb",
       "rate", rate(mbit), "ceil", rate(mbit), "burst", burst(mbit), "cburst", burst(mbit))


def shape(ns: str, dev: str, link_mbit: float, held: list[tuple[str, float]], match: str) -> None:
    """htb on `dev`'s egress: the link class, a default class under it, and one class per
    (peer address, rate) in `held`, chosen by `match` ("dst" or "src") address."""
    sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", f"{DEFAULT_CLASS:x}")
    htb_class(ns, dev, "1:", f"1:{LINK_CLASS:x}", link_mbit)
    htb_class(ns, dev, f"1:{LINK_CLASS:x}", f"1:{DEFAULT_CLASS:x}", link_mbit)
    for k, (peer, mbit) in enumerate(held):
        classid = f"1:{PAIR_CLASS_BASE + k:x}"
        htb_class(ns, dev, f"1:{LINK_CLASS:x}", classid, mbit)
        sh("tc", "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
           "match", "ip", match, f"{peer}/32", "flowid", classid)


def held_pairs(layout: TestbedLayout, machine: int) -> list[tuple[str, float]]:
    """(peer address, rate) of each pair of `machine` held below its link."""
    return [(layout.machines[p.b if p.a == machine else p.a].address, p.mbit)
            for p in layout.pairs if machine in (p.a, p.b)]


def build_hub(layout: TestbedLayout) -> None:
    sh("ip", "netns", "add", layout.hub)
    sh("ip", "-n", layout.hub, "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "-n", layout.hub, "link", "set", BRIDGE, "up")
    sh("ip", "-n", layout.hub, "link", "set", "lo", "up")


def build_machine(layout: TestbedLayout, slot: MachineSlot, loopback_own_name: bool) -> None:
    """The machine's namespace, its veth to the hub's bridge, address, loopback, hosts file
    and shaping on both ends."""
    ns, hub = slot.namespace, layout.hub
    write_hosts(slot.namespace, layout.hosts_file(slot.index, loopback_own_name))
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", hub, "link", "add", slot.hub_interface, "type", "veth", "peer", "name", slot.interface,
       "netns", ns)
    sh("ip", "-n", hub, "link", "set", slot.hub_interface, "master", BRIDGE)
    sh("ip", "-n", hub, "link", "set", slot.hub_interface, "up")
    sh("ip", "-n", ns, "addr", "add", f"{slot.address}/{SUBNET_BITS}", "dev", slot.interface)
    sh("ip", "-n", ns, "link", "set", slot.interface, "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    held = held_pairs(layout, slot.index)
    shape(ns, slot.interface, slot.link_mbit, held, "dst")
    shape(hub, slot.hub_interface, slot.link_mbit, held, "src")


def write_hosts(namespace: str, text: str) -> None:
    folder = NETNS_ETC / namespace
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text(text)


def set_link_rate(layout: TestbedLayout, machine: int, mbit: float) -> None:
    """Change `machine`'s link class on both ends (its pair classes stay, capped by it)."""
    slot = layout.machines[machine]
    for ns, dev in ((slot.namespace, slot.interface), (layout.hub, slot.hub_interface)):
        htb_class(ns, dev, "1:", f"1:{LINK_CLASS:x}", mbit, verb="change")
        htb_class(ns, dev, f"1:{LINK_CLASS:x}", f"1:{DEFAULT_CLASS:x}", mbit, verb="change")


def set_link_state(layout: TestbedLayout, machine: int, up: bool) -> None:
    """Cut or restore `machine`'s cable: its bridge port goes down (its own interface keeps
    its address and routes and sees no carrier, like a pulled cable)."""
    slot = layout.machines[machine]
    sh("ip", "-n", layout.hub, "link", "set", slot.hub_interface, "up" if up else "down")


def namespace_pids(namespace: str) -> list[int]:
    done = sh("ip", "netns", "pids", namespace, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def kill_namespace_processes(names: list[str], wait_s: float = 5.0) -> list[int]:
    """SIGKILL every process inside the namespaces; returns the pids killed (once they are gone)."""
    killed = []
    for ns in names:
        for pid in namespace_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    while any(namespace_pids(ns) for ns in names) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def remove(names: list[str]) -> dict[str, list]:
    """Remove the namespaces (their processes first: a namespace a process holds outlives its
    name) and their hosts folders. Returns what was removed, by kind."""
    existing = set(namespaces())
    killed = kill_namespace_processes([n for n in names if n in existing])
    removed = []
    for ns in names:
        if ns in existing and sh("ip", "netns", "del", ns, check=False).returncode == 0:
            removed.append(ns)
    folders = [str(NETNS_ETC / ns) for ns in names if (NETNS_ETC / ns).is_dir()]
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return {"namespaces": removed, "processes": killed, "hosts folders": folders}


def temp_folders(prefix: str) -> list[str]:
    """A testbed's temporary folders (`tempfile.mkdtemp(prefix=...)`) whose name starts with `prefix`."""
    root = Path(tempfile.gettempdir())
    return sorted(str(p) for p in root.iterdir() if p.name.startswith(prefix) and p.is_dir())


def leftovers(prefix: str) -> list[str]:
    """Namespaces and hosts folders whose name starts with `prefix`."""
    found = {ns for ns in namespaces() if ns.startswith(prefix)}
    if NETNS_ETC.is_dir():
        found |= {p.name for p in NETNS_ETC.iterdir() if p.name.startswith(prefix)}
    return sorted(found)
