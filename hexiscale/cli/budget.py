"""`--time-limit` is a promise about the command, not the solver: from the moment the process
started (Python's start-up and imports included) to its last line of output.

A command asks its `CommandBudget` what a solver may take: the time left less what the work
after the solve is expected to cost (pricing the plan, the views, the idle explanation,
writing files), which grows with the cluster. The explanation after the solve gets the
budget's deadline and says what it left out when it ran out.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

MIN_SOLVE_S = 0.05  # a solver always gets this much, even when the limit is already spent
# after the solve: pricing, summary views and writing cost about this per device (measured at
# 10^5 GPUs: 0.6 s of evaluate and 0.9 s of views and writing on one plan; 1.7–2.5 s and 0.2 s
# on `solve -t 10/30`'s, of hundreds of pipelines of ~49 stages and 10^5 micro-batches, whose
# simulated 1F1B schedules are most of it — 3.7 s before the watch tested every cycle at once,
# when `solve -t 10` took 12.1 s), plus a fixed part:
# the status table and the interpreter's exit with the solvers' libraries loaded (0.15 s left
# `solve -s cpsat -t 5` on the 96-GPU offers problem at 4.93–5.05 s; its explanation ends at
# the output deadline, the table and the exit took 0.2–0.3 s after it)
AFTER_SOLVE_PER_DEVICE_S = 2.5e-5
AFTER_SOLVE_FIXED_S = 0.3
AFTER_SOLVE_SHARE = 0.2  # never more than this share of the limit is held back for it
# a picture drawn after the solve: matplotlib's import and one figure (0.78 s measured for
# `frontier -o`'s, 0.26 s once imported); `frontier -t 60` on 1,024 GPUs ended at 60.5 s without it
PICTURE_S = 1.0
EXPLAIN_SHARE, EXPLAIN_MAX_S = 0.1, 5.0  # the idle explanation's part of the limit, and its cap


_FROM_PROCESS_START = False  # set by the console entry point; in-process callers count from the call


def count_from_process_start() -> None:
    """Called by `hexiscale`'s entry point: the process is the command, so its start-up counts.
    A command invoked inside a longer process (a test's CliRunner, a notebook) counts from the
    call instead: that process's age is not the command's."""
    global _FROM_PROCESS_START
    _FROM_PROCESS_START = True


def seconds_since_process_start() -> float:
    """How long ago this process started (Linux: /proc; elsewhere 0, i.e. from the first call);
    0 unless the process is the command (see `count_from_process_start`)."""
    if not _FROM_PROCESS_START:
        return 0.0
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
        return max(0.0, now - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class CommandBudget:
    """The wall-clock budget of one command, counted from its process's start."""

    limit_s: float
    started: float = field(default_factory=lambda: time.perf_counter() - seconds_since_process_start())

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.limit_s - self.elapsed()

    @property
    def deadline(self) -> float:
        """The end of the budget on `time.perf_counter`'s clock."""
        return self.started + self.limit_s

    def after_solve(self, num_devices: int, plans: int = 1, picture: bool = False) -> float:
        """What the work after the solve is expected to take: `plans` plans of `num_devices`
        priced, shown and written, and a picture drawn (capped at a share of the limit)."""
        expected = AFTER_SOLVE_FIXED_S + plans * AFTER_SOLVE_PER_DEVICE_S * num_devices + PICTURE_S * picture
        return min(AFTER_SOLVE_SHARE * self.limit_s, expected)

    def for_solver(self, num_devices: int, share: float = 1.0, explain: bool = True, plans: int = 1,
                   picture: bool = False) -> float:
        """A solver's time limit: `share` of what is left once the work after the solve (and, with
        `explain`, the idle explanation's part) is held back."""
        after = self.after_solve(num_devices, plans, picture)
        if explain:
            after += min(EXPLAIN_MAX_S, EXPLAIN_SHARE * self.limit_s)
        return max(MIN_SOLVE_S, (self.left() - after) * share)

    def output_deadline(self, num_devices: int) -> float:
        """Until when the explanations may run: the deadline less the writing of the output."""
        return self.deadline - self.after_solve(num_devices)
