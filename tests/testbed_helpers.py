"""Shared by the emulated-cluster tests: skip where the host cannot build one, and count what
a testbed might leave behind (namespaces, hosts folders, temp folders, root links, processes
inside any namespace it made)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from runtime.testbed import Testbed, leftovers, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
REASON = unavailable_reason()
needs_testbed = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_prefix() -> str:
    """A prefix only this test uses (other testbeds may be up at the same time)."""
    return f"hxtbt{uuid.uuid4().hex[:6]}"


test_prefix.__test__ = False


def root_links() -> list[str]:
    done = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in done.stdout.splitlines())


def namespace_inodes(bed: Testbed) -> set[int]:
    """The kernel's ids of the testbed's namespaces (a process still inside one after its name
    is deleted keeps it alive: /proc/PID/ns/net names it)."""
    return {os.stat(f"/var/run/netns/{ns}").st_ino for ns in bed.layout.namespaces}


def processes_in(inodes: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                link = os.readlink(entry / "ns" / "net")
            except OSError:
                continue
            if int(link.split("[")[1].rstrip("]")) in inodes:
                found.append(int(entry.name))
    return found


def temp_folders(prefix: str) -> list[str]:
    return sorted(p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(prefix))


def state(prefix: str) -> dict:
    return {"namespaces and hosts folders": leftovers(prefix), "temp folders": temp_folders(prefix),
            "root links": root_links()}


def wait_gone(inodes: set[int], timeout_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_in(inodes)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


PYTHON = sys.executable
