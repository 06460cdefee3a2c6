"""Predicted against measured step time across machines, on the emulated cluster (issue 32,
docs/testbed.md, docs/calibration.md §9): plans whose traffic crosses shaped links.

    .venv/bin/python benchmarks/bench_cross_machine.py [--repeats 3] [--steps 6] [--only NAME ...]

Each testbed below is brought up, profiled across its machines (`profile --testbed`'s path:
runtime/profiling/testbed.py), and each of its plans is run `--repeats` times, each machine
running the command `hexiscale run --torchrun` prints for it (runtime/testbed/runs.py). A run's
measured step is the median over its steps after the warm-up; a plan's is the median over its
repetitions (the host's 2 cores are shared with other work: single runs scatter). Predictions:
- after profile: T of docs/cost-model.md §3 on the profiled cluster (a sequence plan: §7 on the
  cluster profiled for sequence plans), and T with the pipeline schedule simulated;
- after profile, probe-scaled: η scaled by a probe of the model pass on the testbed just before
  each run against the profile's (as bench_calibration.py does): what the machine's drift
  between profile and run leaves of the error taken out;
- after calibrate: on the cluster `calibrate` refits from the testbed's other plans' runs
  (leave-one-plan-out; a testbed of one layered plan refits on that plan's own repetitions,
  marked "in-sample"; a sequence plan takes η from the layered runs' refit, as
  bench_calibration.py does).
The bench model (8 layers, hidden 512, fp32) and training are bench_calibration.py's. Every
plan runs 2 processes (1 per core) but "several DP syncs", which needs two stages on each of
two machines: 4 processes, 2 per core. Link rates: the cluster file's × one scale per testbed.
Writes benchmarks/report/cross_machine.json and the report benchmarks/report/cross_machine.md (with
benchmarks/report/cross_machine_notes.md, written by hand, at its end).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402

from planner.calibration import CalibrationError  # noqa: E402
from planner.calibration_runs import predicted_rows, refit, scaled_cluster  # noqa: E402
from planner.hardware import Cluster, GpuType, Machine  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.sequence.plan import Group, Member, Replica, SeqPlan  # noqa: E402
from runtime.launch.launcher import make_job  # noqa: E402
from runtime.metrics.runlog import RUNLOG_FILE, read_run_log  # noqa: E402
from runtime.profiling.fit import drift, profiled_cluster  # noqa: E402
from runtime.profiling.launcher import ProfileSpec  # noqa: E402
from runtime.profiling.testbed import profile_on_testbed  # noqa: E402
from runtime.testbed import Testbed, unavailable_reason  # noqa: E402
from runtime.testbed.layout import MBIT_PER_GBPS  # noqa: E402
from runtime.testbed.runs import TestbedLaunch  # noqa: E402
from bench_calibration import MODELS, SEQ_TRAINING, TRAINING, plan_of, simulated_step, with_fitted_eta  # noqa: E402
from cross_machine_report import write_report  # noqa: E402

console = Console(width=150)
MODEL = MODELS["medium"]
PROFILE_MAX_BYTES = 1 << 25


@dataclass(frozen=True)
class Case:
    label: str
    plan: object
    recompute: bool = False


@dataclass(frozen=True)
class Bed:
    """One emulated cluster: its file, the rate its links are shaped to, the profile's layout."""

    name: str
    cluster: Cluster
    mbit: float  # the shaped rate of its (fastest) link
    per_machine: tuple[int, ...]  # the profile's processes per machine
    cases: tuple[Case, ...]

    @property
    def scale(self) -> float:
        return self.mbit / (float(np.max(self.cluster.bw_matrix[~np.eye(len(self.cluster.machines), dtype=bool)]))
                            * MBIT_PER_GBPS)


def pair(name: str, count: int = 1) -> Cluster:
    return Cluster(name=name, inter_bw_gbps=1.25, machines=[Machine(name=f"{name}-a", gpu="RTX4090", count=count,
                                                                    intra_bw_gbps=16),
                                                            Machine(name=f"{name}-b", gpu="RTX4090", count=count,
                                                                    intra_bw_gbps=16)])


def mixed() -> Cluster:
    """An nvidia machine and an amd one: every byte between them crosses the vendor bridge."""
    return Cluster(name="mixed", inter_bw_gbps=25.0, cross_vendor_bw_gbps=10.0,
                   machines=[Machine(name="nv-0", gpu="A100-80G", count=1, intra_bw_gbps=300),
                             Machine(name="amd-0", gpu="MI210", count=1, intra_bw_gbps=64)])


RING = SeqPlan(problem="bench-cross-machine-seq", replicas=(
    Replica(batch=2, ring=(Group(members=(Member(device=0, heads=8, tokens=256),)),
                           Group(members=(Member(device=1, heads=8, tokens=256),)))),))
# two pipelines whose stages sit on both machines the other way round: both DP groups (layers
# 0-3, layers 4-7) and the embedding's and head's cross the link at once, from both machines
CROSSED = plan_of((2, 2), [[((0,), 4), ((2,), 4)], [((3,), 4), ((1,), 4)]])
BEDS = (
    Bed("slow", pair("slow"), 200.0, (1, 1), (
        Case("PP 4/4 across machines", plan_of((4,), [[((0,), 4), ((1,), 4)]])),
        Case("PP 6/2 across machines, recompute", plan_of((4,), [[((0,), 6), ((1,), 2)]]), True),
        Case("DP2 across machines (200 Mbit/s)", plan_of((2, 2), [[((0,), 8)], [((1,), 8)]])),
        Case("sequence: ring of 2 across machines, s=512", RING, True))),
    Bed("fast", pair("fast"), 800.0, (1, 1), (
        Case("DP2 across machines (800 Mbit/s)", plan_of((2, 2), [[((0,), 8)], [((1,), 8)]])),
        Case("PP 4/4 across machines (800 Mbit/s)", plan_of((4,), [[((0,), 4), ((1,), 4)]])))),
    Bed("mixed", mixed(), 400.0, (1, 1), (
        Case("PP 4/4 over the vendor bridge", plan_of((4,), [[((0,), 4), ((1,), 4)]])),
        Case("DP2 over the vendor bridge", plan_of((2, 2), [[((0,), 8)], [((1,), 8)]])))),
    Bed("shared", pair("shared", count=2), 400.0, (2, 2), (
        Case("2 pipelines' DP syncs leave each machine at once (4 processes)", CROSSED),)),
)


def problem_of(bed: Bed, case: Case, cluster: Cluster) -> Problem:
    if isinstance(case.plan, SeqPlan):
        return Problem(name="bench-cross-machine-seq", cluster=cluster, model=MODEL, training=SEQ_TRAINING)
    training = TRAINING.model_copy(update={"recompute": case.recompute})
    return Problem(name="bench-calibration", cluster=cluster, model=MODEL, training=training)


def with_vendors(profiled: Cluster, like: Cluster) -> Cluster:
    """The profiled cluster with `like`'s vendors: one measured GPU type per vendor (the same
    figures; on CPU vendors are labels) and the bridge at the measured inter-machine figures."""
    data = profiled.model_dump(mode="json")
    measured = data["gpu_types"][0]
    vendors = [like.catalog[m.gpu].vendor.value for m in like.machines]
    data["gpu_types"] = [{**measured, "name": f"cpu-{v}", "vendor": v} for v in dict.fromkeys(vendors)]
    for machine, vendor in zip(data["machines"], vendors):
        machine["gpu"] = f"cpu-{vendor}"
    data["cross_vendor_bw_gbps"] = data["inter_bw_gbps"]
    data["cross_vendor_latency_us"] = data.get("inter_latency_us") or 0.0
    return Cluster.model_validate(data)


def fitted_clusters(result, bed: Bed) -> dict:
    """The profiled cluster for each kind of plan (the median's fit; where it is refused the
    mean's; a sequence cluster refused both ways is the layered one, said in its name)."""
    clusters = {}
    for plans in ("layered", "sequence"):
        for statistic in ("median", "mean"):
            try:
                cluster, _, _ = profiled_cluster(result, name=f"tb-{bed.name}-{statistic}", gpu_name="cpu",
                                                 statistic=statistic, plans=plans)
                break
            except CalibrationError as exc:
                console.print(f"  {plans} fit ({statistic}) refused: {exc}", highlight=False)
                cluster = None
        if cluster is None and plans == "sequence":
            cluster = clusters["layered"].model_copy(update={"name": f"{clusters['layered'].name}-all-reduce-fit"})
        if cluster is None:
            raise CalibrationError(f"{bed.name}: the profile's layered fit is refused")
        clusters[plans] = with_vendors(cluster, bed.cluster) if bed.cluster.mixes_vendors else cluster
    return clusters


def profile(bed: Bed, testbed: Testbed, folder: Path, tries: int = 2) -> dict:
    """The testbed profiled (again where its fit is refused: a noisy stretch of the shared cores)."""
    spec = ProfileSpec(machines=bed.per_machine, model=MODEL, seq_len=TRAINING.seq_len,
                       micro_batch=TRAINING.micro_batch, max_bytes=PROFILE_MAX_BYTES, repeats=5)
    for attempt in range(tries):
        result = profile_on_testbed(testbed, spec, folder / f"profile-{bed.name}-{attempt}")
        try:
            clusters = fitted_clusters(result, bed)
            break
        except CalibrationError as exc:
            if attempt == tries - 1:
                raise
            console.print(f"  {exc}: profiling again", highlight=False)
    layered = clusters["layered"]
    console.print(f"profiled {bed.name}: inter {layered.inter_bw_gbps:.4f} GB/s (shaped "
                  f"{bed.mbit / MBIT_PER_GBPS:.4f}), α {layered.inter_latency_us:.0f} µs; drift {drift(result):.0%}",
                  highlight=False)
    return {"clusters": clusters, "drift": drift(result), "inter_gbps": layered.inter_bw_gbps,
            "inter_latency_us": layered.inter_latency_us, "model_s": result.model.seconds}


def probe(bed: Bed, testbed: Testbed, folder: Path) -> float:
    """The model pass's median seconds on the testbed now (every process at once, briefly)."""
    spec = ProfileSpec(machines=bed.per_machine, model=MODEL, seq_len=TRAINING.seq_len,
                       micro_batch=TRAINING.micro_batch, max_bytes=2048, warmup=1, repeats=4, rounds=1)
    return profile_on_testbed(testbed, spec, folder).model.seconds


def run_case(bed: Bed, testbed: Testbed, case: Case, steps: int, out: Path):
    """One run on the testbed; its record (median over steps after the warm-up), or None."""
    problem = problem_of(bed, case, bed.cluster)
    job = make_job(problem, case.plan, "problem", steps=steps, recompute=case.recompute, timeout_s=120.0,
                   out_dir=str(out))
    result, _ = TestbedLaunch(testbed)(job)
    if not result.ok:
        console.print(f"  {case.label}: the run failed:\n{result.failure_summary()}", highlight=False)
        return None
    path = out / RUNLOG_FILE  # written by the run itself: rank 0's worker, under torchrun (runtime/launch/worker.py)
    return read_run_log(path).record(str(path), statistic="median")


def measure_bed(bed: Bed, args, folder: Path) -> tuple[dict, dict]:
    """The bed's profile and each case's (record, probe seconds before it) per repetition."""
    records = {}
    with Testbed(bed.cluster, scale=bed.scale) as testbed:
        profiled = profile(bed, testbed, folder)
        for i, case in enumerate(bed.cases):
            records[case.label] = []
            for r in range(args.repeats):
                where = folder / f"{bed.name}-{i}-{r}"
                probe_s = probe(bed, testbed, where.with_name(where.name + "-probe"))
                record = run_case(bed, testbed, case, args.steps, where)
                if record is not None:
                    records[case.label].append((record, probe_s))
                    console.print(f"  {case.label}: step {record.step_s * 1e3:.0f} ms (probe {probe_s * 1e3:.0f} ms, "
                                  f"profile {profiled['model_s'] * 1e3:.0f})", highlight=False)
    return profiled, records


def on(record, cluster: Cluster):
    return replace(record, problem=record.problem.model_copy(update={"cluster": cluster}))


def prices(record, cluster: Cluster) -> tuple[float, float]:
    """(T, T with the schedule simulated) of the record's plan on `cluster`."""
    problem = record.problem.model_copy(update={"cluster": cluster})
    return float(predicted_rows(problem, record.plan)[-1]), simulated_step(problem, record.plan)


def calibrated(case: Case, bed_records: dict, profiled: dict) -> tuple[Cluster | None, str]:
    """The cluster refitted from the bed's other layered plans' runs (this plan's own where it
    is the only one), and how; None with the reason where the fit is refused."""
    base = profiled["clusters"]["layered"]
    layered = {label: [r for r, _ in runs] for label, runs in bed_records.items()
               if runs and not isinstance(runs[0][0].plan, SeqPlan)}
    others = [on(r, base) for label, recs in layered.items() if label != case.label for r in recs]
    how = "leave-one-plan-out"
    if not others:
        others, how = [on(r, base) for r in layered.get(case.label, [])], "in-sample"
    try:
        fitted, _ = refit(others, keep_undetermined=True)
    except (CalibrationError, ValueError) as exc:
        return None, f"refused: {exc}"
    if isinstance(case.plan, SeqPlan):
        fitted = with_fitted_eta(profiled["clusters"]["sequence"], base, fitted)
    return fitted, how


def probe_scaled(cluster: Cluster, factor: float) -> Cluster:
    return scaled_cluster(cluster, {g.name: factor for g in cluster.gpu_types}, {})


def row_of(bed: Bed, case: Case, runs: list, profiled: dict, bed_records: dict) -> dict:
    kind = "sequence" if isinstance(case.plan, SeqPlan) else "layered"
    records, measured = [r for r, _ in runs], [r.step_s for r, _ in runs]
    row = {"bed": bed.name, "mbit": bed.mbit, "plan": case.label, "processes": len(case.plan.devices),
           "measured_s": statistics.median(measured), "measured_runs_s": measured,
           "spread": (max(measured) - min(measured)) / statistics.median(measured), "drift": profiled["drift"],
           "profiled_inter_gbps": profiled["inter_gbps"], "profiled_inter_latency_us": profiled["inter_latency_us"],
           "probe_ratios": [p / profiled["model_s"] for _, p in runs]}
    cluster = profiled["clusters"][kind]
    row |= dict(zip(("profile_s", "profile_sim_s"), prices(records[0], cluster)))
    probed = [prices(r, probe_scaled(cluster, p / profiled["model_s"])) for r, p in runs]
    row |= {"probe_s": statistics.median(t for t, _ in probed), "probe_sim_s": statistics.median(s for _, s in probed)}
    fitted, how = calibrated(case, bed_records, profiled)
    row["calibrated_how"] = how
    row |= dict(zip(("calibrated_s", "calibrated_sim_s"), prices(records[0], fitted) if fitted else (np.nan,) * 2))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--only", nargs="*", help="testbeds to measure (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "report" / "cross_machine.json")
    args = parser.parse_args()
    if (reason := unavailable_reason()) is not None:
        console.print(f"error: {reason}", highlight=False)
        sys.exit(1)
    folder, start, rows = Path(tempfile.mkdtemp(prefix="bench-cross-machine-")), time.monotonic(), []
    for bed in BEDS:
        if args.only and bed.name not in args.only:
            continue
        profiled, bed_records = measure_bed(bed, args, folder)
        rows += [row_of(bed, case, bed_records[case.label], profiled, bed_records) for case in bed.cases
                 if bed_records.get(case.label)]
    args.out.write_text(json.dumps({"rows": rows, "repeats": args.repeats, "steps": args.steps,
                                    "minutes": (time.monotonic() - start) / 60, "work": str(folder)}, indent=1))
    write_report(json.loads(args.out.read_text()), args.out.with_suffix(".md"), console)


if __name__ == "__main__":
    main()
