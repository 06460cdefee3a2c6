"""The typer application and the error handling every command shares."""

from __future__ import annotations

import functools
from typing import Callable

import typer
from rich.console import Console
from rich.markup import escape

from planner.violations import InvalidPlanError
from planner.io import InputError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Plan and run LLM training on heterogeneous GPU clusters.")
console = Console()


@app.callback()
def _root() -> None:
    """Plan and run LLM training on heterogeneous GPU clusters."""

err_console = Console(stderr=True)

EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """Print one line to stderr and exit: never a traceback for bad input."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def friendly_errors(func: Callable) -> Callable:
    """Turn input errors into one line and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            fail(str(exc))
        except InvalidPlanError as exc:
            fail("; ".join(str(v) for v in exc.violations))

    return wrapper
