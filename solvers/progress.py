"""The solvers' transient progress bars (the layered heuristic's bar, the sequence heuristic's
spinner): on stderr, because stdout may carry the plan's JSON, and on a terminal only, because
elsewhere (a log file, `2>err.txt`) each refresh of a transient bar leaves a blank line."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, ProgressColumn

from solvers.common import SolverOptions


def terminal_progress(options: SolverOptions, *columns: ProgressColumn | str) -> Progress | None:
    """A transient bar of `columns` when `options.progress` and stderr is a terminal, else None."""
    stderr = Console(stderr=True)
    if not (options.progress and stderr.is_terminal):
        return None
    return Progress(*columns, console=stderr, transient=True)
