"""The table `bench_cross_machine.py` prints and writes (benchmarks/report/cross_machine.md):
each plan's measured step against its predictions after profile and after calibrate.

    .venv/bin/python benchmarks/cross_machine_report.py   # the report again from cross_machine.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

KEYS = {"profile_s": "profile", "profile_sim_s": "profile, sim", "probe_s": "probe-scaled",
        "probe_sim_s": "probe-scaled, sim", "calibrated_s": "calibrate", "calibrated_sim_s": "calibrate, sim"}
HERE = Path(__file__).parent


def error(row: dict, key: str) -> float:
    return row[key] / row["measured_s"] - 1.0


def summary(rows: list[dict], key: str) -> str:
    errors = np.abs([error(r, key) for r in rows])
    errors = errors[~np.isnan(errors)]
    if not len(errors):
        return "—"
    return f"{np.mean(errors):.1%} / {np.max(errors):.1%} ({len(errors)})"


SUBSETS = {"1 process per core": lambda r: r["processes"] <= 2, "all": lambda r: True}


def cells(row: dict) -> list[str]:
    return [row["bed"], f"{row['mbit']:.0f}", row["plan"], str(row["processes"]), f"{row['measured_s'] * 1e3:.0f}",
            f"{row['spread']:.0%}", *(f"{error(row, key):+.1%}" for key in KEYS), row["calibrated_how"]]


COLUMNS = ("testbed", "Mbit/s", "plan", "procs", "measured ms", "spread", *KEYS.values(), "calibrated on")


def table(data: dict) -> Table:
    out = Table(title="step time across emulated machines: error of each prediction against measured "
                      "(median of the repetitions)")
    for column in COLUMNS:
        out.add_column(column, justify="left" if column in ("plan", "calibrated on") else "right")
    for row in data["rows"]:
        out.add_row(*cells(row))
    out.caption = "\n".join(f"{name}: mean |error| / worst (rows) " + ", ".join(
        f"{label} {summary([r for r in data['rows'] if keep(r)], key)}" for key, label in KEYS.items())
        for name, keep in SUBSETS.items())
    return out


def markdown(data: dict) -> str:
    lines = ["# Predicted against measured across machines (emulated cluster)\n",
             f"`benchmarks/bench_cross_machine.py` ({data['minutes']:.0f} min): each plan run {data['repeats']} "
             f"times for {data['steps']} steps on the testbed (docs/testbed.md), each machine running the command "
             "`hexiscale run --torchrun` prints for it; measured = the median over the repetitions of each run's "
             "median step after the warm-up (the host's 2 cores are shared with other work). \"spread\": "
             "(slowest − fastest repetition) / median. Errors are predicted / measured − 1: §3's T after "
             "`profile` on the testbed, the same with the pipeline schedule simulated (\"sim\"); both with η "
             "scaled by a probe of the model pass just before each run against the profile's (\"probe-scaled\": "
             "the machine's drift between profile and run taken out; median over the runs); and both after "
             "`calibrate` (refitted on the testbed's other plans' runs, or in-sample where it has one plan).\n",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    if again := data.get("remeasured"):  # `--only BED` run later, its rows put in place of the old
        lines.insert(2, f"Testbeds {', '.join(again['beds'])} measured again later ({again['minutes']:.0f} min, "
                        f"{again['why']}); the other rows are from the full run.\n")
    lines += ["| " + " | ".join(cells(row)) + " |" for row in data["rows"]]
    lines += ["", "| rows | " + " | ".join(KEYS.values()) + " |", "|---|" + "---|" * len(KEYS)]
    for name, keep in SUBSETS.items():
        chosen = [r for r in data["rows"] if keep(r)]
        lines.append(f"| {name} | " + " | ".join(summary(chosen, key) for key in KEYS) + " |")
    lines.append("\n(mean |error| / worst, and the rows counted)\n")
    notes = HERE / "report/cross_machine_notes.md"  # written by hand after a run
    if notes.is_file():
        lines.append(notes.read_text())
    return "\n".join(lines)


def write_report(data: dict, out: Path, console: Console) -> None:
    console.print(table(data))
    out.write_text(markdown(data))
    console.print(f"wrote {out}", highlight=False)


if __name__ == "__main__":
    source = HERE / "report" / "cross_machine.json"
    write_report(json.loads(source.read_text()), source.with_suffix(".md"), Console(width=150))
    sys.exit(0)
