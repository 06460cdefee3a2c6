"""§3.3's closed form against the simulated schedule, on the calibration bench's measured runs
(docs/cost-model.md §3.3, issue 32). Measures nothing: each `bench_calibration.py` report
(benchmarks/report/calibration.json at the given git revisions) holds its profiled clusters
and each layered run's measured step time; this prices every run again at this code on the
cluster its profile wrote — T (§3.3, the objective) and T with the schedule simulated event
by event (`evaluate`'s simulated_s) — and prints both errors against the measured step.

    .venv/bin/python benchmarks/bench_schedule_sim.py [--revisions REV ...] [--out FILE]

The default revisions are the six reports written with today's bench plans, model and
training (earlier ones ran other plans). "uneven" rows are the pipelines whose stages differ
(layer splits 6/2 and 5/3, TP 2 beside TP 1): where §3.3's fill and drain, Σ τ, was measured
high. Rows of cluster B run 2 processes per core, where the miss is the oversubscribed
cores' (docs/calibration.md); they are summed apart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from planner import Problem, evaluate  # noqa: E402
from planner.hardware import Cluster  # noqa: E402
from bench_calibration import MODELS, PER_CORE, PLANS, TRAINING, plan_of  # noqa: E402

REVISIONS = ("59647a2", "e2015ce", "8b57e5c", "2c66fa6", "1586db2", "18097f0")
REPORT = "benchmarks/report/calibration.json"
UNEVEN = {"PP 6/2 recompute", "PP 5/3 across machines recompute", "TP2 | PP 6/2 recompute"}
STATS = ("mean", "median")
console = Console()


def report_at(revision: str) -> dict:
    root = Path(__file__).resolve().parents[1]
    return json.loads(subprocess.check_output(["git", "show", f"{revision}:{REPORT}"], cwd=root))


def priced(report: dict, revision: str) -> list[dict]:
    """Every layered run of one report: measured, and T and T simulated on its profiled cluster."""
    specs = {(name, spec[0]): spec for name, plans in PLANS.items() for spec in plans}
    rows = []
    for run in report["runs"]:
        spec = specs.get((run["cluster"], run["plan"]))
        if spec is None:  # a sequence plan: no pipeline schedule
            continue
        label, recompute, batches, stages = spec
        row = {"revision": revision, "cluster": run["cluster"], "plan": label, "uneven": label in UNEVEN}
        for stat in STATS:
            cluster = Cluster.model_validate(report["clusters"][run["cluster"]][stat])
            training = TRAINING.model_copy(update={"recompute": recompute})
            estimate = evaluate(Problem(name="bench-calibration", cluster=cluster, model=MODELS["medium"],
                                        training=training), plan_of(batches, stages))
            measured = run[f"measured_{stat}"]
            row |= {f"measured_{stat}": measured, f"closed_{stat}": estimate.iteration_s / measured - 1,
                    f"simulated_{stat}": estimate.simulated_s / measured - 1,
                    f"reported_{stat}": run[f"profile_{stat}"] / measured - 1}
        rows.append(row)
    return rows


SUBSETS = {"uneven, 1 process per core": lambda r: r["uneven"] and PER_CORE[r["cluster"]] == 1,
           "uneven, all": lambda r: r["uneven"],
           "1 process per core (A, C)": lambda r: PER_CORE[r["cluster"]] == 1,
           "2 processes per core (B)": lambda r: PER_CORE[r["cluster"]] == 2}


def summary(rows: list[dict]) -> dict:
    out = {}
    for subset, keep in SUBSETS.items():
        chosen = [r for r in rows if keep(r)]
        out[subset] = {f"{key}_{stat}": {"mean": float(np.mean(np.abs([r[f"{key}_{stat}"] for r in chosen]))),
                                         "worst": float(np.max(np.abs([r[f"{key}_{stat}"] for r in chosen]))),
                                         "signed": float(np.mean([r[f"{key}_{stat}"] for r in chosen])),
                                         "n": len(chosen)}
                       for key in ("closed", "simulated") for stat in STATS}
    return out


def tables(rows: list[dict], summed: dict) -> tuple[Table, Table]:
    runs = Table(title="step time after profile: §3.3's T and T with the schedule simulated, against measured")
    for column in ("rev", "cluster", "plan", "mean ms", "§3.3", "simulated", "median ms", "§3.3", "simulated"):
        runs.add_column(column, justify="right")
    for r in rows:
        cells = [c for stat in STATS for c in (f"{r[f'measured_{stat}'] * 1e3:.0f}", f"{r[f'closed_{stat}']:+.1%}",
                                               f"{r[f'simulated_{stat}']:+.1%}")]
        runs.add_row(r["revision"], r["cluster"], r["plan"] + (" *" if r["uneven"] else ""), *cells)
    sums = Table(title="mean |error| (worst; mean signed error) over the reports' runs")
    for column in ("runs", "n", "§3.3, mean", "simulated, mean", "§3.3, median", "simulated, median"):
        sums.add_column(column, justify="right")
    for subset, got in summed.items():
        cells = [f"{g['mean']:.1%} ({g['worst']:.1%}; {g['signed']:+.1%})"
                 for g in (got[f"{key}_{stat}"] for stat in STATS for key in ("closed", "simulated"))]
        sums.add_row(subset, str(got["closed_mean"]["n"]), *cells)
    return runs, sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--revisions", nargs="+", default=list(REVISIONS))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "report" / "schedule_sim.json")
    args = parser.parse_args()
    rows = [row for revision in args.revisions for row in priced(report_at(revision), revision)]
    summed = summary(rows)
    runs, sums = tables(rows, summed)
    console.print(runs)
    console.print(sums)
    args.out.write_text(json.dumps({"revisions": args.revisions, "runs": rows, "summary": summed}, indent=1))
    console.print(f"wrote {args.out}", highlight=False)


if __name__ == "__main__":
    main()
