"""How the communicator waits (runtime.communication.comm_types.Waiter, runtime.communication.communicator.waits_awake): a
polled wait ends as soon as the work is done, hands a longer one to the blocking wait with
the rest of the timeout, and names what timed out; ranks poll only while this host's ranks'
threads fit its cores. The work objects here are stand-ins with torch's Work interface
(is_completed, wait(timeout) -> bool), so the timing rules are checked without a world."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch

from runtime.communication.communicator import waits_awake
from runtime.communication import comm_types
from runtime.communication.comm_types import SPIN_S, Waiter


class Work:
    """Done after `polls` calls of is_completed; `wait` records its timeout and answers
    whether the work is done by then (never, when `never`)."""

    def __init__(self, polls: int = 0, never: bool = False):
        self.polls, self.never, self.waited = polls, never, []

    def is_completed(self) -> bool:
        self.polls -= 1
        return not self.never and self.polls < 0

    def wait(self, timeout: timedelta) -> bool:
        self.waited.append(timeout.total_seconds())
        return not self.never


class SteadyClock:
    """`time` for comm_types with a monotonic clock that moves 1 µs per reading: 50 polls then
    take 50 µs whatever the machine's load (on a busy 2-core machine, 50 real yields once
    outlasted SPIN_S and the wait stopped polling at the 46th)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        self.now += 1e-6
        return self.now


def test_a_polled_wait_returns_once_the_work_is_done_and_waits_once(monkeypatch):
    monkeypatch.setattr(comm_types, "time", SteadyClock())
    work = Work(polls=50)
    Waiter(timeout_s=10.0, poll=True).finish(work, "x")
    assert work.polls == -1  # polled 51 times: the 51st saw it done
    assert len(work.waited) == 1 and work.waited[0] == pytest.approx(10.0 - 51e-6, abs=1e-5)


def test_a_long_wait_polls_for_at_most_the_spin_then_blocks_for_the_rest():
    work = Work(never=True)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="the message from rank 3 not done within 2 s"):
        Waiter(timeout_s=2.0, poll=True).finish(work, "the message from rank 3")
    spun = time.monotonic() - start
    assert SPIN_S <= spun < 1.0  # the stand-in's wait returns at once: what passed is the spin
    assert 2.0 - spun - 0.01 <= work.waited[0] <= 2.0 - SPIN_S


def test_an_unpolled_wait_never_asks_and_blocks_for_the_whole_timeout():
    work = Work(polls=10**9)
    Waiter(timeout_s=3.0).finish(work, "x")
    assert work.polls == 10**9 and len(work.waited) == 1 and work.waited[0] == pytest.approx(3.0, abs=0.1)


def test_ranks_poll_only_while_their_threads_fit_the_cores(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores))
    assert waits_awake(torch.device("cpu"), world_size=10 * cores)  # the host's ranks, not the world's
    assert not waits_awake(torch.device("cuda", 0), world_size=1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores + 1))
    assert not waits_awake(torch.device("cpu"), world_size=1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert waits_awake(torch.device("cpu"), world_size=cores) and not waits_awake(torch.device("cpu"), cores + 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert waits_awake(torch.device("cpu"), world_size=max(cores // 2, 1)) == (cores >= 2)
    assert not waits_awake(torch.device("cpu"), world_size=cores)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert waits_awake(torch.device("cpu"), world_size=1) and not waits_awake(torch.device("cpu"), 1, wait="asleep")


def test_ranks_that_outnumber_the_cores_are_said_to_share_them():
    """runtime.host: the rule waits_awake and the CLI's note share, at cores given explicitly."""
    from runtime.host import shared_cores_note, threads_fit

    assert threads_fit(2, 1, cores=2) and threads_fit(1, 2, cores=2)
    assert not threads_fit(4, 1, cores=2) and not threads_fit(2, 2, cores=2)
    assert shared_cores_note(2, 1, cores=2) == ""
    note = shared_cores_note(4, 1, cores=2)
    assert note.startswith("4 processes of 1 thread share 2 cores (2 per core)") and "Accuracy on the development machine" in note
    assert shared_cores_note(3, 2, cores=4).startswith("3 processes of 2 threads share 4 cores (1.5 per core)")


def test_far_too_many_cpu_ranks_are_refused_before_any_starts():
    """runtime.host.too_many_ranks at 8 per core; `profile --processes 1000` had started them all."""
    from typer.testing import CliRunner

    from hexiscale.cli import app
    from runtime.host import MAX_RANKS_PER_CORE, too_many_ranks, usable_cores

    assert too_many_ranks(16, cores=2) is None and too_many_ranks(17, cores=2).startswith("17 processes on 2 cores")
    out = CliRunner().invoke(app, ["profile", "--processes", str(MAX_RANKS_PER_CORE * usable_cores() + 1),
                                   "-o", "never.yaml"])
    assert out.exit_code == 2 and "at most 8 per core" in out.output, out.output


def test_a_local_run_of_too_many_ranks_is_refused_and_torchrun_is_suggested(monkeypatch, tmp_path):
    """`run` (gloo, here) checks the plan's processes as `profile` does, before any starts: the
    bundled demo-tiny plan's 4 devices against a host of 1 core at 1 per core."""
    from typer.testing import CliRunner

    import runtime.host
    from hexiscale.cli import app

    monkeypatch.setattr(runtime.host, "usable_cores", lambda: 1)
    monkeypatch.setattr(runtime.host, "MAX_RANKS_PER_CORE", 1)
    out = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", "--steps", "1", "--out", str(tmp_path / "o")])
    assert out.exit_code == 2 and "the plan uses 4 devices" in out.output and "--torchrun" in out.output, out.output
    assert not (tmp_path / "o" / "runlog.json").exists()
