"""The one number under `hexiscale run`'s predicted-against-measured table: the mean |error|
over its rows (each stage's τ, or each sequence replica's T_mb, and the step T), so a reader
sees at a glance how close the cost model came on this run (`make demo` ends with it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hexiscale.cli.calibrate import errors_of
from hexiscale.cli.views import views_for
from planner.violations import InvalidPlanError
from runtime.metrics.runlog import RUNLOG_FILE, read_run_log


def table_errors(out_dir: str | Path) -> tuple[np.ndarray, list[str]] | None:
    """The relative errors of the table's rows (the units', then the step's) and the rows'
    names, from the run log in `out_dir`; None when the run wrote none or its shape cannot be
    priced (the table said why)."""
    path = Path(out_dir) / RUNLOG_FILE
    if not out_dir or not path.exists():
        return None
    try:
        record = read_run_log(path).record(str(path))
        errors = errors_of(record)[2]
    except (InvalidPlanError, ValueError):
        return None
    return errors, [unit for unit, _, _ in views_for(record.plan).timed_units(record.plan)] + ["step"]


def mean_error_line(out_dir: str | Path) -> str:
    """'mean |error| 8.4 % over the table's 3 rows (worst +12.1 %: step)', or "" without a table."""
    found = table_errors(out_dir)
    if found is None:
        return ""
    errors, names = found
    worst = int(np.argmax(np.abs(errors)))
    rows = f"{len(errors)} row{'s' if len(errors) != 1 else ''}"
    return (f"mean |error| {np.mean(np.abs(errors)) * 100:.1f} % over the table's {rows} "
            f"(worst {errors[worst] * 100:+.1f} %: {names[worst]})")
