"""Commands started as a terminal starts them, for the tests that Ctrl-C them.

A process keeps the signals its parent ignored (exec keeps SIG_IGN) and the parent's signal mask.
A suite started in the background of a non-interactive shell (as CI may start it) begins with
SIGINT ignored in every process, POSIX's rule for asynchronous commands; a command run
in-process and interrupted ends by ignoring it too. A command a test then started went on through
the test's SIGINT, and the test timed out with nothing on stderr (CI, and make test here, on
2026-12-07). A shell starts each command of a terminal with SIGINT and SIGTERM at their defaults
and unmasked; so do these."""

from __future__ import annotations

import signal
import subprocess

TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def as_from_a_terminal() -> None:
    """`preexec_fn`: run in the child between fork and exec."""
    for signum in TERMINAL_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINAL_SIGNALS)


def terminal_popen(command: list[str], **popen) -> subprocess.Popen:
    """subprocess.Popen(command, **popen), the signals as a terminal leaves them."""
    return subprocess.Popen(command, preexec_fn=as_from_a_terminal, **popen)
