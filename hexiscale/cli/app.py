"""The typer application and the error handling every command shares."""

from __future__ import annotations

import functools
import math
import os
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Callable

import click
import typer
import typer.rich_utils
from rich.console import Console
from rich.markup import escape

from hexiscale.interrupt import interrupted
from planner.base import MAX_SEED
from planner.violations import InvalidPlanError
from planner.io import InputError
from solvers.common import MAX_TIME_LIMIT_S

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Plan and run LLM training on heterogeneous GPU clusters.")
console = Console()


err_console = Console(stderr=True)

# exit codes, the same for every command (README): 0 ok, 1 infeasible / no plan / a run that
# failed, 2 bad input, 3 an internal error (a bug of ours: the message says how to report it)
EXIT_INFEASIBLE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def one_line_usage_error(exc: click.ClickException) -> None:
    """A bad option or argument (`-t abc`, `--steps 0`) as one line, like every other bad input,
    where typer drew a five-line box with the usage: `error: Invalid value for '--steps': 0 is
    not in the range x>=1. (hexiscale run --help)`. Its exit code (2) is typer's, unchanged."""
    ctx = getattr(exc, "ctx", None)
    where = f" ({ctx.command_path} --help)" if ctx is not None else ""
    err_console.print(f"error: {exc.format_message()}{where}", markup=False, highlight=False, soft_wrap=True)


# typer formats a ClickException through this function (typer.core._main, when rich is there);
# it has no option for a plain one-line message, so the function is replaced once, here
typer.rich_utils.rich_format_error = one_line_usage_error


def _version(value: bool) -> None:
    if value:
        try:
            version = metadata.version("hexiscale")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        console.print(f"hexiscale {version}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Plan and run LLM training on heterogeneous GPU clusters."""


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """Print one line to stderr and exit: never a traceback for bad input."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def friendly_errors(func: Callable) -> Callable:
    """Input errors become one line and exit code 2; anything unexpected becomes one line
    and exit code 3 (HEXISCALE_DEBUG=1 shows the traceback instead)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            fail(str(exc))
        except InvalidPlanError as exc:
            fail("; ".join(str(v) for v in exc.violations))
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
            raise  # typer's own exits and usage errors
        except KeyboardInterrupt:
            interrupted()  # one line: typer's own handling printed nothing at all
        except Exception as exc:  # noqa: BLE001 - the one place a bug meets the user
            if os.environ.get("HEXISCALE_DEBUG"):
                raise
            fail(f"internal error ({type(exc).__name__}: {exc}); rerun with HEXISCALE_DEBUG=1 for the "
                 f"traceback and report it", code=EXIT_INTERNAL)

    return wrapper


LARGE_DEVICES = 1024  # from this cluster size on, long work reports each stage on stderr


class WorkLog:
    """One line per stage of long work on stderr, with the time the previous stage took, so
    that a log (no terminal, no spinner) shows where the work is. Silent for small inputs."""

    def __init__(self, enabled: bool):
        self.enabled, self.started = enabled, None

    @classmethod
    def for_cluster(cls, cluster) -> WorkLog:
        return cls(cluster.num_devices >= LARGE_DEVICES)

    def step(self, what: str) -> None:
        self._line(f"{what} …")

    def finish(self) -> None:
        self._line("done")

    def _line(self, text: str) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        took = f" (previous step {now - self.started:.1f} s)" if self.started is not None else ""
        err_console.print(text + took, highlight=False, markup=False)  # it names files and machines
        self.started = now


def progress_line(status, message: str) -> None:
    """`message` on the spinner `status` on a terminal; a line on stderr otherwise (a log shows
    where the work is). Printed as it reads: it names problems, which may hold "[...]"."""
    status.update(escape(message))
    if not err_console.is_terminal:
        err_console.print(message, highlight=False, soft_wrap=True, markup=False)  # one line each in a log


def check_plan_is_for(problem, plan, plan_path, force: bool) -> None:
    """A plan names the problem it was made for; using it for another one is probably a
    mistake (device ids mean other GPUs there), so it needs --force."""
    if plan.problem and plan.problem != problem.name and not force:
        fail(f"{plan_path}: the plan was made for problem {plan.problem!r}, not {problem.name!r} "
             f"(pass --force to use it anyway)")


def invalid_plan_line(plan_path, problem_name: str, broken: list, listed: bool = False) -> str:
    """The one line for a plan that breaks rules of its problem: the file, the first rule broken,
    how many more (`listed`: printed above it, as `validate` does)."""
    more = f" (and {len(broken) - 1} more{', listed above' if listed else ''})" if len(broken) > 1 else ""
    return f"{plan_path}: plan is invalid for {problem_name}: {broken[0]}{more}"


def check_plan_rules(problem, plan, plan_path, *, memory: bool = True) -> None:
    """The plan keeps every rule for this problem (with `memory=False` the structural ones: the
    run's model may be another), or one line naming the plan file and the first broken rule: run
    had said "the plan is invalid for this problem", naming no file."""
    from planner.kinds import validate

    broken = [v for v in validate(problem, plan) if memory or v.rule != "memory"]
    if broken:
        fail(invalid_plan_line(plan_path, problem.name, broken))


STATISTIC_HELP = ("mean | median | min of the repetitions (and of a run's steps) the fit uses: mean (a step adds "
                  "up many operations), median, min (the least disturbed, on shared cores)")


def checked_statistic(value: str) -> str:
    """`--statistic`, one of planner.calibration.STATISTICS, or one line and exit 2."""
    from planner.calibration import STATISTICS

    if value not in STATISTICS:
        fail(f"--statistic must be one of {', '.join(STATISTICS)}, got {value!r}")
    return value


def writable_file(path: Path | None, option: str) -> Path | None:
    """Check, before any long work, that `path` can be written: its folder is a folder, and the
    file opens for appending (os.access would not do: root passes it everywhere, /proc included).
    A file this check creates is removed again. Fails with the option's name."""
    if path is None:
        return None
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        fail(f"{option}: {path} is a folder, expected a file name")
    if folder.exists() and not folder.is_dir():
        fail(f"{option}: cannot write {path}: {folder} is a file, not a folder")
    if not folder.is_dir():
        fail(f"{option}: cannot write {path}: folder {folder} does not exist")
    existed = path.exists()
    try:
        with open(path, "a"):  # appending nothing leaves an existing file as it was
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        fail(f"{option}: cannot write {path}: {exc.strerror or exc}")
    return path


def writable_folder(path: Path | None, option: str) -> Path | None:
    """A folder that exists, or can be created, and takes a file: tried (the folders created for
    the try and the file are removed again), as os.access passes anything for root. Checked
    before any long work."""
    if path is None:
        return None
    path = Path(path)
    if path.exists() and not path.is_dir():
        fail(f"{option}: {path} is a file, expected a folder")
    created = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        fail(f"{option}: cannot write into {path}: {exc.strerror or exc}")
    finally:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:  # never made (mkdir failed above it), or not empty
                pass
    return path


@contextmanager
def writing(path):
    """Around the writing of an output: a write that fails after the work (a full disk,
    /dev/full, a folder gone) is one line and exit 2, as a path refused before it."""
    try:
        yield path
    except OSError as exc:
        fail(f"{path}: cannot write: {exc.strerror or exc}")


# --time-limit, the same option on every command that has one: seconds, finite, at most a week
MIN_TIME_LIMIT_S = 0.001  # the options' own floor (a command's budget is spent on loading before that)


def checked_time_limit(param: typer.CallbackParam, value: float | None) -> float | None:
    """A time limit from MIN_TIME_LIMIT_S to MAX_TIME_LIMIT_S, or one line and exit 2 (inf and
    nan included: the solvers turn the limit into work counts and deadlines)."""
    if value is not None and not (math.isfinite(value) and MIN_TIME_LIMIT_S <= value <= MAX_TIME_LIMIT_S):
        fail(f"{param.opts[0]}: expected seconds from {MIN_TIME_LIMIT_S:g} to {MAX_TIME_LIMIT_S:g} (one week), "
             f"got {value:g}")
    return value


def seed_option(help: str = "random seed"):
    """`--seed`, the same range on every command: 0 … MAX_SEED (what every solver and torch take)."""
    return typer.Option(0, "--seed", min=0, max=MAX_SEED, help=help)


def time_limit_option(help: str, default: float | None = 60.0, *names: str):
    """The `-t/--time-limit` option (or another time limit, by its `names`), checked as above."""
    return typer.Option(default, *(names or ("--time-limit", "-t")), callback=checked_time_limit, help=help)
