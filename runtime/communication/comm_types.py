"""The values the communicator hands out and takes (`runtime.communication.communicator`): where a rank runs, a
process group with its vendors, a posted send or exchange, the bridge's byte meter and a
timed family of collectives. No torch.distributed call is made here; `runtime.communication.communicator` makes
them all and re-exports these names, the communicator layer's one public face.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import torch

from planner.hardware import Vendor
from runtime.metrics.timing import PhaseTimer

ReduceOpName = Literal["sum", "max", "min"]


def spans_vendors(vendors) -> bool:
    """True when ranks of these vendors hold both nvidia and amd (`other` is never bridged)."""
    return {Vendor.nvidia, Vendor.amd} <= set(vendors)


@dataclass(frozen=True)
class RankPlace:
    """Where one rank runs: its plan device, that device's machine and its GPU vendor
    (machine None and vendor `other` when the job carries no cluster)."""

    device: int
    machine: int | None = None
    vendor: Vendor = Vendor.other


@dataclass(frozen=True)
class Group:
    """A process group: its ranks, their vendors, and the backend's opaque handle."""

    ranks: tuple[int, ...]
    vendors: tuple[Vendor, ...]
    handle: object | None  # None: the default (world) group
    parts: tuple[Group, ...] = ()  # a group over both vendors: one subgroup per vendor (VENDOR_ORDER)
    bridge: Group | None = None  # ... and its parts' leaders (first ranks) over gloo
    is_bridge: bool = False  # the leaders' group itself: the one group allowed to span vendors

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def mixes_vendors(self) -> bool:
        """True when the group holds both nvidia and amd ranks (docs/vendors.md §8 bridge)."""
        return spans_vendors(self.vendors)

    def part_of(self, rank: int) -> Group:
        """The vendor part of a mixed group that holds `rank`."""
        return next(p for p in self.parts if rank in p.ranks)


@dataclass
class BridgeMeter:
    """Bytes this rank has sent over the cross-vendor bridge since it started: point-to-point
    payloads to a rank of the other vendor, and its sends in the leaders' collectives (an
    all-gather among V leaders sends a leader's tensor to the V − 1 others). The per-step
    difference is what planner.layered.bridge prices."""

    sent: int = 0


SPIN_S = 5e-3  # longest awake wait: the TP all-reduces and all-to-alls of a CPU run take 1–4 ms


@dataclass(frozen=True)
class Waiter:
    """How this rank waits for a posted operation: at most `timeout_s`, and, with `poll`,
    awake for its first SPIN_S. A polling wait checks for completion in a loop that yields
    the core to any other runnable thread (gloo's own, or another rank's) instead of
    sleeping. On CPU a sleeping wait lets the core go idle, and both the wake-up and the
    compute after it pay: on this project's 2-core machine, a 256 KiB gloo all-reduce
    between two GEMMs took 2.4–3.1 ms polled against 3.0–7.7 ms asleep, and the GEMMs after
    it 2.9–3.4 ms against 3.4–4.4 ms (six alternating rounds of 200). A longer wait sleeps
    after SPIN_S, so that ranks which share cores (two torchrun "machines" on one host)
    cannot starve each other. Only works that report their completion as it happens can be
    polled: gloo's collectives do, its point-to-point messages do not (the communicator
    waits for those unpolled: `Communicator.message_waiter`). On CUDA, waiting only orders
    streams; nothing is polled there."""

    timeout_s: float
    poll: bool = False

    def finish(self, work, what: str) -> None:
        """Wait for `work`; a TimeoutError naming `what` when it is not done in time."""
        start = time.monotonic()
        if self.poll:
            while not work.is_completed() and time.monotonic() - start < SPIN_S:
                os.sched_yield()
        left = max(start + self.timeout_s - time.monotonic(), 1e-3)
        if not work.wait(timedelta(seconds=left)):
            raise TimeoutError(f"{what} not done within {self.timeout_s:g} s")


@dataclass
class PendingSend:
    """A posted non-blocking send (its chunks' works: `duplex.post`); the payload is kept
    alive until it is awaited."""

    works: list
    payload: torch.Tensor
    dst: int
    waiter: Waiter

    def wait(self) -> None:
        for work in self.works:
            self.waiter.finish(work, f"the send to rank {self.dst}")


@dataclass
class PendingExchange:
    """The posted sends and receives of one `Communicator.exchange`."""

    sends: list[PendingSend]
    recvs: list[tuple[list, int]]  # (its chunks' works, src rank)
    waiter: Waiter
    staged: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (host buffer, target)

    def wait(self) -> None:
        """Wait for every receive (each at most the timeout), then for every send; copy
        what came over the bridge into host buffers to its targets."""
        for works, src in self.recvs:
            for work in works:
                self.waiter.finish(work, f"the message from rank {src}")
        for send in self.sends:
            send.wait()
        for host, target in self.staged:
            target.copy_(host)


@dataclass(frozen=True)
class TimedCollectives:
    """Collectives of `kinds` over `group` whose seconds add to `timer`'s `phase`."""

    group: Group
    kinds: tuple[str, ...]
    timer: PhaseTimer
    phase: str
