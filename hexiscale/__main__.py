"""The `hexiscale` command's entry point (pyproject's console script) and `python -m hexiscale`.

Kept tiny, as is the package's `__init__`: the command's modules import torch, ortools, typer
and the planner (about a second), and a Ctrl-C in that second would otherwise print a traceback
of the import it cut. Here it is one line and exit 130, as a Ctrl-C during the work is
(`hexiscale.interrupt`)."""

from hexiscale.interrupt import interrupted


def main() -> None:
    try:
        from hexiscale.cli import main as command  # the heavy imports, inside the handling below

        command()
    except KeyboardInterrupt:
        interrupted()


if __name__ == "__main__":
    main()
