"""The `hexiscale` command's entry point (pyproject's console script) and `python -m hexiscale`.

Kept tiny, as is the package's `__init__`: the command's modules import torch, ortools, typer
and the planner (about a second), and a Ctrl-C in that second would otherwise print a traceback
of the import it cut. Here it is one line and exit 130, as a Ctrl-C during the work (typer's own
handling, or the command's) is."""

import signal
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C


def main() -> None:
    try:
        from hexiscale.cli import main as command  # the heavy imports, inside the handling below

        command()
    except KeyboardInterrupt:
        interrupted()


def interrupted() -> None:
    """One line and exit 130; a second Ctrl-C while it is written cannot cut it into a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stderr.write("error: interrupted\n")
    sys.stderr.flush()
    sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
