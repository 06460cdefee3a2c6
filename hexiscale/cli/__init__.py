"""The `hexiscale` command line (typer + rich). Each command family lives in its own module
and registers itself on `app`."""

from hexiscale.cli.app import app
from hexiscale.cli.budget import count_from_process_start


def main() -> None:
    count_from_process_start()
    app()


# command modules: importing them registers their commands
from hexiscale.cli import inspect as _inspect  # noqa: E402,F401
from hexiscale.cli import generate as _generate  # noqa: E402,F401
from hexiscale.cli import compare as _compare  # noqa: E402,F401
from hexiscale.cli import show as _show  # noqa: E402,F401
from hexiscale.cli import run as _run  # noqa: E402,F401
from hexiscale.cli import hf_run as _hf_run  # noqa: E402,F401
from hexiscale.cli import solve as _solve  # noqa: E402,F401
from hexiscale.cli import replan as _replan  # noqa: E402,F401
from hexiscale.cli import profile as _profile  # noqa: E402,F401
from hexiscale.cli import calibrate as _calibrate  # noqa: E402,F401
from hexiscale.cli import testbed as _testbed  # noqa: E402,F401
from hexiscale.cli import frontier as _frontier  # noqa: E402,F401
