"""This host's cores, and whether the ranks started on it share them (no torch: the CLI asks
before and after runs).

The cost model prices every device as working alone. CPU processes that share cores are not
such devices: a rank computes on a full core while its neighbours wait and on part of one
while they compute, so pipeline stages that take turns run faster than a profile taken with
every rank busy, and ranks that synchronise often run slower (they wait for a neighbour the
scheduler has set aside). `benchmarks/bench_calibration.py` measures how far off that is.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process, and the ranks it starts, may run on."""
    return len(os.sched_getaffinity(0))


# The most CPU ranks per core a command starts: each is a Python process with torch (about
# 220 MB before it computes, measured here), and at 1,000 ranks on 2 cores `profile` spent its
# minutes starting them. Past 8 per core every figure measured is the scheduler's.
MAX_RANKS_PER_CORE = 8


def too_many_ranks(ranks: int, cores: int | None = None) -> str | None:
    """Why `ranks` CPU processes are too many for this host, or None."""
    cores = usable_cores() if cores is None else cores
    if ranks <= MAX_RANKS_PER_CORE * cores:
        return None
    return (f"{ranks} processes on {cores} core{'s' if cores > 1 else ''}: at most {MAX_RANKS_PER_CORE} per core "
            f"({MAX_RANKS_PER_CORE * cores} here) are started, each a Python process with torch")


def threads_fit(ranks: int, threads: int = 1, cores: int | None = None) -> bool:
    """Whether `ranks` processes of `threads` compute threads each fit in the cores."""
    return ranks * threads <= (usable_cores() if cores is None else cores)


def shared_cores_note(ranks: int, threads: int = 1, cores: int | None = None) -> str:
    """A line for a CPU run or profile whose ranks share cores ("" when they fit)."""
    cores = usable_cores() if cores is None else cores
    if threads_fit(ranks, threads, cores):
        return ""
    per_core = ranks * threads / cores
    return (f"{ranks} processes of {threads} thread{'s' if threads > 1 else ''} share {cores} core"
            f"{'s' if cores > 1 else ''} ({per_core:.3g} per core): the cost model prices each device as working "
            f"alone, and ranks that share cores are not (a pipeline stage gets more than its share while its "
            f"neighbours wait, and a collective waits for ranks the scheduler has set aside): expect predictions "
            f"several times further off than at 1 per core (docs/calibration.md, 'Accuracy on the development "
            f"machine')")
