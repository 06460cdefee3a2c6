"""Predicted against measured step time on this machine (DESIGN.md §9, issue 15).

    .venv/bin/python benchmarks/bench_calibration.py [--max-bytes 16777216] [--steps 8] [--out FILE]

1. `profile` two clusters of CPU processes here: A = 2 processes on one machine (1 process per
   core), B = 4 processes on two simulated machines (2 per core), timing the problem's own
   model shapes.
2. Run layered plans of the problem's own (small) model on each — TP sizes 1, 2, layer
   splits, data-parallel pipelines, recompute on and off — and compare each run's measured
   step time (schedule + gradient sync, median over the steps after the first) with the cost
   model's T on the profiled cluster.
3. Hold-out calibration: for each run, refit η and the link bandwidths (`calibrate`'s fit) on
   the *other* runs of its cluster and predict it again.
4. The fitted bandwidth of each link class against a direct large-message p2p.
5. A sequence plan (DESIGN.md §7) on cluster B against its T (its runtime records only the
   whole step's wall time, optimizer included; calibrate covers layered plans only).

Everything twice: with the median of repetitions and steps (the default of profile and
calibrate) and with the fastest (`--statistic min`: on shared cores, the least disturbed).

Prints tables and writes the numbers as JSON (default benchmarks/report/calibration.json).
The machine's load average is printed: on shared cores the measurements are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from planner.calibration import summarize  # noqa: E402
from planner.calibration_runs import predicted_rows, refit  # noqa: E402
from planner.kinds import kind_of  # noqa: E402
from planner.layered.plan import Pipeline, Plan, Stage  # noqa: E402
from planner.sequence.plan import Group, Member, Replica, SeqPlan  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.workload import ModelSpec, TrainingSpec  # noqa: E402
from runtime.launch import run_plan  # noqa: E402
from runtime.profile_fit import profiled_cluster  # noqa: E402
from runtime.profile_launch import ProfileSpec, launch_profile  # noqa: E402
from runtime.runlog import read_run_log  # noqa: E402

console = Console()
MODEL = ModelSpec(name="bench-small", layers=4, hidden=256, heads=8, kv_heads=4, ffn_hidden=688, vocab=512)
TRAINING = TrainingSpec(seq_len=128, global_batch=4, micro_batch=1, recompute=False, act_bytes=4, grad_bytes=4,
                        reserved_gib=0.25)
# per cluster: (label, recompute, batches, stages per pipeline as (devices, layers))
PLANS = {
    "A": [("TP2", False, (4,), [[((0, 1), 4)]]),
          ("TP2 recompute", True, (4,), [[((0, 1), 4)]]),
          ("PP 2/2", False, (4,), [[((0,), 2), ((1,), 2)]]),
          ("PP 3/1 recompute", True, (4,), [[((0,), 3), ((1,), 1)]]),
          ("DP2", False, (2, 2), [[((0,), 4)], [((1,), 4)]])],
    "B": [("DP2 x TP2", False, (2, 2), [[((0, 1), 4)], [((2, 3), 4)]]),
          ("PP2 x TP2 recompute", True, (4,), [[((0, 1), 2), ((2, 3), 2)]]),
          ("PP4 1/1/1/1", False, (4,), [[((0,), 1), ((1,), 1), ((2,), 1), ((3,), 1)]]),
          ("DP2 x PP2 across machines", False, (2, 2), [[((0,), 2), ((2,), 2)], [((1,), 2), ((3,), 2)]]),
          ("TP2 | PP 3/1 recompute", True, (2, 2), [[((0, 1), 4)], [((2,), 3), ((3,), 1)]])],
}
MACHINES = {"A": (2,), "B": (2, 2)}
STATS = ("median", "min")  # the median of repetitions and steps (the default), and the fastest
# A sequence plan (DESIGN.md §7) on cluster B: replica 0 a ring of an uneven Ulysses pair and
# one device, replica 1 one device; s = 512 (token block 64). Its runtime records the whole
# step's wall time only (optimizer included), which is what this row compares.
SEQ_TRAINING = TRAINING.model_copy(update={"seq_len": 512, "global_batch": 2, "recompute": True, "token_block": 64})
SEQ_PLAN = SeqPlan(problem="bench-calibration-seq", replicas=(
    Replica(batch=1, ring=(Group(members=(Member(device=0, heads=4, tokens=128), Member(device=1, heads=4, tokens=128))),
                           Group(members=(Member(device=2, heads=8, tokens=256),)))),
    Replica(batch=1, ring=(Group(members=(Member(device=3, heads=8, tokens=512),)),))))


def plan_of(batches, stages) -> Plan:
    return Plan(problem="bench-calibration",
                pipelines=tuple(Pipeline(batch=b, stages=tuple(Stage(devices=d, layers=n) for d, n in pipe))
                                for b, pipe in zip(batches, stages)))


def profile(name: str, args, folder: Path):
    """The raw measurements of one cluster, and its cluster file under each statistic."""
    spec = ProfileSpec(machines=MACHINES[name], model=MODEL, seq_len=TRAINING.seq_len,
                       micro_batch=TRAINING.micro_batch, max_bytes=args.max_bytes, repeats=args.repeats)
    console.print(f"profiling cluster {name}: {spec.processes} processes on {len(spec.machines)} machine(s) …")
    result = launch_profile(spec, folder / f"profile-{name}")
    fitted = {stat: profiled_cluster(result, name=f"bench-{name}", gpu_name="cpu", statistic=stat)[:2] for stat in STATS}
    return fitted, result


def run_plans(name: str, cluster, args, folder: Path) -> list[dict]:
    problem = Problem(name="bench-calibration", cluster=cluster, model=MODEL, training=TRAINING)
    rows = []
    for label, recompute, batches, stages in PLANS[name]:
        out = folder / f"run-{name}-{label.replace(' ', '_').replace('/', '-')}"
        run_plan(problem, plan_of(batches, stages), model="problem", steps=args.steps, echo=False,
                 recompute=recompute, out_dir=str(out))
        log = read_run_log(out / "runlog.json")
        times = [s.step_s for s in log.steps[1:]]
        rows.append({"cluster": name, "plan": label, "recompute": recompute, "log": log, "source": str(out),
                     "spread": (max(times) - min(times)) / statistics.median(times)})
        console.print(f"  ran {label}: step {statistics.median(times) * 1e3:.1f} ms median", highlight=False)
    return rows


def run_sequence(cluster, args, folder: Path) -> dict:
    """The sequence plan's run: its steps' wall time (after the first) against its T."""
    problem = Problem(name="bench-calibration-seq", cluster=cluster, model=MODEL, training=SEQ_TRAINING)
    result = run_plan(problem, SEQ_PLAN, model="problem", steps=args.steps, echo=False,
                      out_dir=str(folder / "run-B-sequence"))
    times = [s["wall_s"] for s in result.steps[1:]]
    console.print(f"  ran the sequence plan: step {statistics.median(times) * 1e3:.1f} ms median (wall, optimizer "
                  f"included)", highlight=False)
    return {"cluster": "B", "plan": "sequence: ring(Ulysses 2, 1) | 1, s=512", "recompute": True, "times": times,
            "problem": problem, "spread": (max(times) - min(times)) / statistics.median(times)}


def predict_sequence(row: dict, clusters: dict) -> None:
    for stat in STATS:
        problem = row["problem"].model_copy(update={"cluster": clusters["B"][stat][0]})
        row[f"measured_{stat}"] = summarize(row["times"], stat)
        row[f"profile_{stat}"] = float(kind_of(SEQ_PLAN).iteration_time(problem, SEQ_PLAN))
        row[f"calibrated_{stat}"] = float("nan")  # run logs (and calibrate) cover layered plans only


def predict(rows: list[dict], clusters: dict, stat: str) -> None:
    """Under one statistic: each run's T on the profiled cluster, then on the cluster refitted
    from the *other* runs of its cluster (leave-one-out)."""
    for row in rows:
        record = row["log"].record(row["source"], 1, stat)
        row[f"record_{stat}"] = replace(record, problem=record.problem.model_copy(
            update={"cluster": clusters[row["cluster"]][stat][0]}))
    for row in rows:
        record = row[f"record_{stat}"]
        row[f"measured_{stat}"] = record.step_s
        row[f"profile_{stat}"] = float(predicted_rows(record.problem, record.plan)[-1])
        others = [r[f"record_{stat}"] for r in rows if r["cluster"] == row["cluster"] and r is not row]
        try:
            fitted, _ = refit(others)
            row[f"calibrated_{stat}"] = float(predicted_rows(record.problem.model_copy(update={"cluster": fitted}),
                                                             record.plan)[-1])
        except ValueError as exc:  # a refused fit is a result too: shown, not hidden
            row[f"calibrated_{stat}"], row[f"refused_{stat}"] = float("nan"), str(exc)


def error(row: dict, key: str, stat: str) -> float:
    return row[f"{key}_{stat}"] / row[f"measured_{stat}"] - 1.0


def summary(rows: list[dict], key: str, stat: str) -> dict:
    errs = np.abs([error(r, key, stat) for r in rows])
    return {"mean": float(np.nanmean(errs)), "worst": float(np.nanmax(errs)), "n": int(np.sum(~np.isnan(errs)))}


def result_table(rows: list[dict]) -> Table:
    table = Table(title="step time: measured (steps after the first) against the cost model's T")
    table.add_column("cluster")
    table.add_column("plan")
    table.add_column("spread", justify="right")
    for stat in STATS:
        for column in (f"{stat} ms", "profile", "hold-out"):
            table.add_column(column, justify="right")
    for r in rows:
        cells = []
        for stat in STATS:
            cells += [f"{r[f'measured_{stat}'] * 1e3:.1f}", f"{error(r, 'profile', stat):+.1%}",
                      f"{error(r, 'calibrated', stat):+.1%}"]
        table.add_row(r["cluster"], r["plan"], f"{r['spread']:.0%}", *cells)
    lines = []
    for stat in STATS:
        for key, label in (("profile", "after profile"), ("calibrated", "after hold-out calibrate")):
            got = summary(rows, key, stat)
            lines.append(f"{stat}, {label}: mean |error| {got['mean']:.1%}, worst {got['worst']:.1%} ({got['n']} runs)")
    table.caption = "\n".join(lines)
    return table


def link_table(fitted: dict) -> tuple[Table, list[dict]]:
    table = Table(title="fitted link bandwidth against a direct large-message p2p measurement")
    for column in ("cluster", "class", "statistic", "direct GB/s", "p2p fit GB/s", "diff", "joint fit GB/s", "diff"):
        table.add_column(column, justify="right")
    out = []
    for name, per_stat in fitted.items():
        for stat, (_, reports) in per_stat.items():
            for link_class, r in reports.items():
                p2p = r.per_op["p2p"]
                p2p_bw = p2p.bw_gbps if not isinstance(p2p, str) else float("nan")
                out.append({"cluster": name, "class": link_class, "statistic": stat, "direct": r.direct_bw_gbps,
                            "p2p_fit": p2p_bw, "joint_fit": r.joint.bw_gbps, "bytes": r.direct_bytes})
                table.add_row(name, link_class, stat, f"{r.direct_bw_gbps:.3f}", f"{p2p_bw:.3f}",
                              f"{p2p_bw / r.direct_bw_gbps - 1:+.1%}", f"{r.joint.bw_gbps:.3f}",
                              f"{r.joint.bw_gbps / r.direct_bw_gbps - 1:+.1%}")
    return table, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bytes", type=int, default=1 << 24)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-sequence", action="store_true", help="skip the sequence plan's row")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "report" / "calibration.json")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-calibration-"))
    load_before = os.getloadavg()
    rows, fitted = [], {}
    for name in PLANS:
        fitted[name], _ = profile(name, args, folder)
        rows += run_plans(name, fitted[name]["median"][0], args, folder)
    for stat in STATS:
        predict(rows, fitted, stat)
    if not args.no_sequence:
        rows.append(run_sequence(fitted["B"]["median"][0], args, folder))
        predict_sequence(rows[-1], fitted)
    console.print(result_table(rows))
    links, link_rows = link_table(fitted)
    console.print(links)
    load_after = os.getloadavg()
    console.print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}; {os.cpu_count()} cores",
                  highlight=False)
    drop = {"log", "problem", "times"} | {f"record_{stat}" for stat in STATS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "runs": [{k: v for k, v in r.items() if k not in drop} for r in rows], "links": link_rows,
        "summary": {stat: {key: summary(rows, key, stat) for key in ("profile", "calibrated")} for stat in STATS},
        "clusters": {n: {stat: c.model_dump(mode="json", exclude_defaults=True) for stat, (c, _) in per.items()}
                     for n, per in fitted.items()},
        "load_average_before": load_before, "load_average_after": load_after}, indent=1))
    console.print(f"wrote {args.out} (work files in {folder})", highlight=False)


if __name__ == "__main__":
    main()
