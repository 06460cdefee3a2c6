"""Predicted against measured step time on this machine (docs/calibration.md §9, issue 15).

    .venv/bin/python benchmarks/bench_calibration.py [--model medium|small] [--steps 8] [--out FILE] [--again WORK_FOLDER]

1. `profile` three clusters of CPU processes here, timing the problem's own model shapes:
   A = 2 processes on one machine and C = 2 machines of 1 process (1 process per core), and
   B = 2 machines of 2 processes (2 per core). Each profile's drift (its model pass's rounds'
   spread) is printed: how steady the machine was while it was measured. A profile whose fit
   is refused (a figure outside physical sense, or undetermined) is tried once more; a
   cluster refused twice is left out; the report's "refused_profiles" keeps every reason.
2. Run layered plans of the problem's own model (`--model`, see MODELS) on each — TP sizes 1, 2, layer
   splits, data-parallel pipelines, recompute on and off — and compare each run's measured
   step time (schedule + gradient sync, over the steps after the warm-up) with the cost
   model's T on the profiled cluster. Before each run a short probe times the model pass
   again (as the profile does): T with η scaled by the probe against the profile's model
   pass ("probe-scaled") takes out how far the machine moved between profile and run, and
   leaves the cost model's own error.
3. Hold-out calibration: for each run, refit η and the link bandwidths and latencies
   (`calibrate --keep-undetermined`'s fit) on the *other* runs of its cluster and predict it
   again.
4. Each operation's fitted bandwidth against its own direct large-message measurement.
5. A sequence plan (docs/sequence-plans.md §7) on A and on B: its run log (each replica's slowest member
   per micro-batch, the step without the optimizer) against T on the cluster profiled for
   sequence plans (`profile --for sequence`: the all-to-all fit, η over §7.2's FLOPs), and
   against T on that cluster with η as the layered runs refitted it (their links are
   all-reduce fits, which do not price all-to-alls). Each TP stage's and each sequence replica's
   time is split as the runs timed it (collectives apart) against the cost model's parts.
6. The noise floor: cluster A's first plan is run again at the end; no model predicts the
   difference between two runs of one plan.

Every prediction of a layered plan is made twice: T of docs/cost-model.md §3.3 (the objective),
and T with the pipeline schedule simulated event by event ("sim" columns: `evaluate`'s
simulated_s); a sequence plan has no pipeline schedule, its "sim" is its T.
`benchmarks/bench_schedule_sim.py` prices the earlier reports' runs both ways.

Everything twice: with the mean of repetitions and steps (the default of profile and
calibrate: a step adds up many operations) and with the median (`--statistic median`).

The model has 8 layers (LLMs have dozens): the costs the cost model prices once per model,
not per layer — and those it leaves out, such as the vocabulary-parallel embedding's and
head's extra collectives — then weigh roughly as in a real model and not as in a 2-layer toy.

Prints tables and writes the numbers as JSON (default benchmarks/report/calibration.json) and
a picture of predicted against measured beside it (calibration.png).
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

from planner.calibration import CalibrationError, summarize  # noqa: E402
from planner.calibration_runs import predicted_rows, refit, scaled_cluster  # noqa: E402
from planner.layered.evaluate import evaluate  # noqa: E402
from planner.layered.plan import Pipeline, Plan, Stage  # noqa: E402
from planner.sequence.plan import Group, Member, Replica, SeqPlan  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.workload import ModelSpec, TrainingSpec  # noqa: E402
from runtime.launch.launcher import run_plan  # noqa: E402
from runtime.profiling.fit import drift, profiled_cluster  # noqa: E402
from runtime.profiling.launcher import ProfileResult, ProfileSpec, launch_profile  # noqa: E402
from runtime.metrics.runlog import WARMUP_STEPS, read_run_log  # noqa: E402
from calibration_tables import KEYS, STATS, error, link_table, result_table, seq_split, tp_split  # noqa: E402
from report_figures import draw_calibration  # noqa: E402

console = Console()
# The problem's model, by --model. "medium" (the default): GEMMs of 128 × 512 × 1376 take
# 2–3 ms here, so the per-operation costs no term of docs/cost-model.md §3 prices (a kernel's start,
# a TP rank's unsplit norms and copies) are small beside them, as they are on GPUs at LLM
# sizes. "small": 4× less work per operation, where those costs show (see docs/calibration.md).
MODELS = {"medium": ModelSpec(name="bench-medium", layers=8, hidden=512, heads=8, kv_heads=4, ffn_hidden=1376,
                              vocab=512),
          "small": ModelSpec(name="bench-small", layers=8, hidden=256, heads=8, kv_heads=4, ffn_hidden=688,
                             vocab=512)}
TRAINING = TrainingSpec(seq_len=128, global_batch=4, micro_batch=1, recompute=False, act_bytes=4, grad_bytes=4,
                        reserved_gib=0.25)
# per cluster: (label, recompute, batches, stages per pipeline as (devices, layers))
PLANS = {
    "A": [("TP2", False, (4,), [[((0, 1), 8)]]),
          ("TP2 recompute", True, (4,), [[((0, 1), 8)]]),
          ("PP 4/4", False, (4,), [[((0,), 4), ((1,), 4)]]),
          ("PP 6/2 recompute", True, (4,), [[((0,), 6), ((1,), 2)]]),
          ("DP2", False, (2, 2), [[((0,), 8)], [((1,), 8)]])],
    "C": [("PP 4/4 across machines", False, (4,), [[((0,), 4), ((1,), 4)]]),
          ("PP 5/3 across machines recompute", True, (4,), [[((0,), 5), ((1,), 3)]]),
          ("DP2 across machines", False, (2, 2), [[((0,), 8)], [((1,), 8)]])],
    "B": [("DP2 x TP2", False, (2, 2), [[((0, 1), 8)], [((2, 3), 8)]]),
          ("PP2 x TP2 recompute", True, (4,), [[((0, 1), 4), ((2, 3), 4)]]),
          ("PP4 2/2/2/2", False, (4,), [[((0,), 2), ((1,), 2), ((2,), 2), ((3,), 2)]]),
          ("DP2 x PP2 across machines", False, (2, 2), [[((0,), 4), ((2,), 4)], [((1,), 4), ((3,), 4)]]),
          ("TP2 | PP 6/2 recompute", True, (2, 2), [[((0, 1), 8)], [((2,), 6), ((3,), 2)]])],
}
MACHINES = {"A": (2,), "C": (1, 1), "B": (2, 2)}
PER_CORE = {"A": 1, "C": 1, "B": 2}  # processes per core on this 2-core machine
# Sequence plans (docs/sequence-plans.md §7), s = 512 (token block 64). On A: one uneven Ulysses pair.
# On B: replica 0 a ring of an uneven Ulysses pair and one device, replica 1 one device.
SEQ_TRAINING = TRAINING.model_copy(update={"seq_len": 512, "global_batch": 2, "recompute": True, "token_block": 64})
SEQ_PLANS = {
    "A": ("sequence: Ulysses 6+2 heads, s=512", SeqPlan(problem="bench-calibration-seq", replicas=(
        Replica(batch=2, ring=(Group(members=(Member(device=0, heads=6, tokens=384),
                                               Member(device=1, heads=2, tokens=128))),)),))),
    "B": ("sequence: ring(Ulysses 2, 1) | 1, s=512", SeqPlan(problem="bench-calibration-seq", replicas=(
        Replica(batch=1, ring=(Group(members=(Member(device=0, heads=4, tokens=128),
                                               Member(device=1, heads=4, tokens=128))),
                               Group(members=(Member(device=2, heads=8, tokens=256),)))),
        Replica(batch=1, ring=(Group(members=(Member(device=3, heads=8, tokens=512),)),))))),
}


def plan_of(batches, stages) -> Plan:
    return Plan(problem="bench-calibration",
                pipelines=tuple(Pipeline(batch=b, stages=tuple(Stage(devices=d, layers=n) for d, n in pipe))
                                for b, pipe in zip(batches, stages)))


def profile(name: str, args, folder: Path) -> tuple[dict | None, list[str]]:
    """`profile_once`, again when its fit is refused (a figure outside physical sense, or one
    its measurements do not determine: on these shared cores, a noisy stretch), and each
    refusal's reason, printed as it comes. None when every try was refused: the cluster's
    rows are left out, and the report says why."""
    refused = []
    for attempt in range(PROFILE_TRIES):
        try:
            return profile_once(name, args, folder / f"try{attempt}"), refused
        except CalibrationError as exc:
            console.print(f"  cluster {name}: profile refused ({exc})", highlight=False)
            refused.append(str(exc))
    return None, refused


PROFILE_TRIES = 2


def profile_once(name: str, args, folder: Path):
    """The raw measurements of one cluster, and its cluster files under each statistic: for
    layered plans, and for sequence plans (`--for sequence`). Both at the layered plans'
    shapes: profiled at the sequence plans' s = 512 instead, the sequence rows came out
    further off (−35 % against −17 % on the same runs) — the model pass runs faster at 512
    tokens than the runtime's sequence members do at their 128–384."""
    spec = ProfileSpec(machines=MACHINES[name], model=MODELS[args.model], seq_len=TRAINING.seq_len,
                       micro_batch=TRAINING.micro_batch, max_bytes=args.max_bytes, repeats=args.repeats)
    console.print(f"profiling cluster {name}: {spec.processes} processes on {len(spec.machines)} machine(s) …")
    result = measured_profile(spec, folder / f"profile-{name}", args)
    moved = drift(result)
    console.print(f"  model pass rounds {', '.join(f'{r * 1e3:.1f}' for r in result.model_rounds)} ms: "
                  f"drift {moved:.0%}", highlight=False)
    fitted = {stat: profiled_cluster(result, name=f"bench-{name}", gpu_name="cpu", statistic=stat)[:2] for stat in STATS}
    for_sequence = {stat: profiled_cluster(result, name=f"bench-{name}", gpu_name="cpu", statistic=stat,
                                           plans="sequence")[:2] for stat in STATS}
    return {"layered": fitted, "sequence": for_sequence, "drift": moved, "model_s": result.model.mean_s}


def measured_profile(spec: ProfileSpec, where: Path, args) -> ProfileResult:
    """The profile's processes' result, or with --again the one an earlier run wrote there."""
    if args.again:
        return ProfileResult.model_validate_json((where / "profile.json").read_text())
    return launch_profile(spec, where)


def probe(name: str, args, where: Path) -> float:
    """The machine's speed just before a run: the whole model's forward + backward timed as
    the profile times it (every process of the cluster at once), in one short burst. Its
    ratio to the profile's time says how far the machine moved between the two; no model
    sees that coming, and the "probe-scaled" column takes it out of the prediction."""
    spec = ProfileSpec(machines=MACHINES[name], model=MODELS[args.model], seq_len=TRAINING.seq_len,
                       micro_batch=TRAINING.micro_batch, max_bytes=2048, warmup=1, repeats=4, rounds=1)
    return measured_profile(spec, where, args).model.mean_s


def run_dir(folder: Path, name: str, label: str) -> Path:
    return folder / f"run-{name}-{label.replace(' ', '_').replace('/', '-').replace(':', '').replace(',', '')}"


def run_layered(name: str, problem: Problem, plan_spec, args, out: Path) -> dict:
    label, recompute, batches, stages = plan_spec
    probe_s = probe(name, args, out.with_name(out.name + "-probe"))
    if not args.again:
        run_plan(problem, plan_of(batches, stages), model="problem", steps=args.steps, echo=False,
                 recompute=recompute, out_dir=str(out))
    return finished_run(name, label, recompute, out, probe_s)


def finished_run(name: str, label: str, recompute: bool, out: Path, probe_s: float) -> dict:
    """A run's row, read back from its run log: its steps' spread, and the probe before it."""
    log = read_run_log(out / "runlog.json")
    times = [s.step_s for s in log.steps[WARMUP_STEPS:]]
    console.print(f"  ran {label}: step {statistics.median(times) * 1e3:.1f} ms median", highlight=False)
    return {"cluster": name, "plan": label, "recompute": recompute, "log": log, "source": str(out),
            "spread": (max(times) - min(times)) / statistics.median(times), "probe_s": probe_s}


def run_plans(name: str, cluster, args, folder: Path) -> list[dict]:
    problem = Problem(name="bench-calibration", cluster=cluster, model=MODELS[args.model], training=TRAINING)
    return [run_layered(name, problem, spec, args, run_dir(folder, name, spec[0])) for spec in PLANS[name]]


def run_sequence(name: str, cluster, args, folder: Path) -> dict:
    """A sequence plan's run: its run log (per replica T_mb, step T) like a layered run's."""
    label, plan = SEQ_PLANS[name]
    problem = Problem(name="bench-calibration-seq", cluster=cluster, model=MODELS[args.model], training=SEQ_TRAINING)
    out = run_dir(folder, name, "sequence")
    probe_s = probe(name, args, out.with_name(out.name + "-probe"))
    if not args.again:
        run_plan(problem, plan, model="problem", steps=args.steps, echo=False, out_dir=str(out))
    return finished_run(name, label, True, out, probe_s)


def noise_floor(first: dict, args, folder: Path) -> dict:
    """Cluster A's first plan run again at the end: two runs of one plan on one cluster."""
    spec = PLANS["A"][0]
    problem = first["log"].run_problem.model_copy(update={"training": TRAINING})
    again = run_layered("A", problem, spec, args, run_dir(folder, "A", spec[0] + " again"))
    out = {"plan": spec[0]}
    for stat in STATS:
        a, b = (summarize([s.step_s for s in r["log"].steps[WARMUP_STEPS:]], stat) for r in (first, again))
        out[stat] = {"first": a, "again": b, "difference": b / a - 1.0}
    return out


def predict(rows: list[dict], profiles: dict[str, dict], stat: str) -> None:
    """Under one statistic: each run's T on the cluster profiled for its kind of plan
    (`profile --for`: the all-reduce fit for layered, the all-to-all fit for sequence); the
    same with η scaled by the machine's speed at the run's start (the probe against the
    profile's model pass: drift taken out, the cost model's own error left); then on the
    cluster refitted from the *other* layered runs of its cluster (leave-one-out). A sequence
    plan is in no fit (a cluster has one, and its own row shows how far the cost model is
    from its runtime); it is predicted on its own profiled cluster with η as the layered
    runs refitted it (`with_fitted_eta`)."""
    for row in rows:
        record = row["log"].record(row["source"], statistic=stat)
        kind = "sequence" if isinstance(record.plan, SeqPlan) else "layered"
        row[f"record_{stat}"] = replace(record, problem=record.problem.model_copy(
            update={"cluster": profiles[row["cluster"]][kind][stat][0]}))
    for row in rows:
        record = row[f"record_{stat}"]
        row[f"measured_{stat}"] = record.step_s
        row[f"profile_{stat}"] = float(predicted_rows(record.problem, record.plan)[-1])
        row[f"profile_sim_{stat}"] = simulated_step(record.problem, record.plan)
        slower = row["probe_s"] / profiles[row["cluster"]]["model_s"]
        steady = scaled_cluster(record.problem.cluster, {"cpu": slower}, {})
        row[f"steady_{stat}"] = float(predicted_rows(record.problem.model_copy(update={"cluster": steady}),
                                                     record.plan)[-1])
        others = [r[f"record_{stat}"] for r in rows if r["cluster"] == row["cluster"] and r is not row
                  and not isinstance(r["log"].plan, SeqPlan)]
        try:
            fitted, figures = refit(others, keep_undetermined=True)
            if isinstance(record.plan, SeqPlan):
                fitted = with_fitted_eta(record.problem.cluster, others[0].problem.cluster, fitted)
            row[f"calibrated_{stat}"] = float(predicted_rows(record.problem.model_copy(update={"cluster": fitted}),
                                                             record.plan)[-1])
            row[f"calibrated_sim_{stat}"] = simulated_step(record.problem.model_copy(update={"cluster": fitted}),
                                                           record.plan)
            row[f"kept_{stat}"] = [f"{f.kind} {f.name}: {f.kept_why}" for f in figures if f.kept_why]
        except ValueError as exc:  # a refused fit is a result too: shown, not hidden
            row[f"calibrated_{stat}"], row[f"refused_{stat}"] = float("nan"), str(exc)
            row[f"calibrated_sim_{stat}"] = float("nan")


def simulated_step(problem: Problem, plan) -> float:
    """T with the pipeline schedule simulated (`evaluate`'s simulated_s); a sequence plan's T."""
    if isinstance(plan, SeqPlan):
        return float(predicted_rows(problem, plan)[-1])
    return evaluate(problem, plan).simulated_s


def with_fitted_eta(cluster, base, fitted):
    """`cluster` with η of each GPU type moved as the fit moved it from `base`; its links kept.
    The layered runs' links are fits to all-reduces and stage sends, as `profile --for layered`
    writes them; a sequence plan's traffic is all-to-alls, which `profile --for sequence`
    fits apart (2-3 times slower here at the same bytes). η is what transfers between them."""
    factors = {g.name: g.efficiency / fitted.catalog[g.name].efficiency for g in base.gpu_types}
    return scaled_cluster(cluster, factors, {})


def summary(rows: list[dict], key: str, stat: str) -> dict:
    errs = np.abs([error(r, key, stat) for r in rows])
    if not np.any(~np.isnan(errs)):
        return {"mean": float("nan"), "worst": float("nan"), "n": 0}
    return {"mean": float(np.nanmean(errs)), "worst": float(np.nanmax(errs)), "n": int(np.sum(~np.isnan(errs)))}


SUBSETS = {"1 process per core (A, C)": lambda r: PER_CORE[r["cluster"]] == 1,
           "2 processes per core (B)": lambda r: PER_CORE[r["cluster"]] == 2,
           "all": lambda r: True}


def summaries(rows: list[dict]) -> dict:
    return {subset: {stat: {key: summary([r for r in rows if keep(r)], key, stat) for key in KEYS}
                     for stat in STATS} for subset, keep in SUBSETS.items()}


def profile_and_run(args, folder: Path) -> tuple[list[dict], dict, list[dict], dict]:
    """Each cluster profiled, then its plans run: (layered rows, profiles, sequence rows, the
    refusals' reasons per cluster). A cluster whose every profile was refused is left out;
    cluster A cannot be (the noise floor is its first plan run twice)."""
    rows, profiles, sequence, refused = [], {}, [], {}
    for name in PLANS:
        measured, reasons = profile(name, args, folder)
        if reasons:
            refused[name] = reasons
        if measured is None:
            if name == "A":
                sys.exit(f"cluster A: all {PROFILE_TRIES} profiles refused: {'; '.join(reasons)} "
                         f"(work files in {folder})")
            continue
        profiles[name] = measured
        rows += run_plans(name, profiles[name]["layered"]["median"][0], args, folder)
        if name in SEQ_PLANS and not args.no_sequence:
            sequence.append(run_sequence(name, profiles[name]["layered"]["median"][0], args, folder))
    return rows, profiles, sequence, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bytes", type=int, default=1 << 28, help="largest message (profile's default)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--model", choices=tuple(MODELS), default="medium", help="the problem's model (see MODELS)")
    parser.add_argument("--no-sequence", action="store_true", help="skip the sequence plans' rows")
    parser.add_argument("--again", type=Path, metavar="WORK_FOLDER",
                        help="measure nothing: read the profiles and run logs of an earlier run's work files "
                             "(the folder it printed) and compute the tables again, e.g. after a change to the fit")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "report" / "calibration.json")
    args = parser.parse_args()
    folder = args.again or Path(tempfile.mkdtemp(prefix="bench-calibration-"))
    load_before = os.getloadavg()
    rows, profiles, sequence, refused = profile_and_run(args, folder)
    floor = noise_floor(rows[0], args, folder)
    rows += sequence
    for stat in STATS:
        predict(rows, profiles, stat)
    summed = summaries(rows)
    console.print(result_table(rows, summed))
    console.print("noise floor: " + ", ".join(f"{stat}: {f['first'] * 1e3:.1f} → {f['again'] * 1e3:.1f} ms "
                                               f"({f['difference']:+.1%})" for stat, f in floor.items() if stat in STATS)
                  + f" — cluster A's {floor['plan']} run first and again at the end", highlight=False)
    fitted = {n: p["layered"] for n, p in profiles.items()}
    links, link_rows = link_table(fitted)
    console.print(links)
    split, split_rows = tp_split(rows)
    console.print(split)
    seq_table, seq_rows = seq_split(rows)
    console.print(seq_table)
    load_after = os.getloadavg()
    console.print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}; {os.cpu_count()} cores",
                  highlight=False)
    drop = {"log"} | {f"record_{stat}" for stat in STATS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "runs": [{k: v for k, v in r.items() if k not in drop} for r in rows], "links": link_rows,
        "summary": summed, "noise_floor": floor, "tp_split": split_rows, "sequence_split": seq_rows,
        "clusters": {n: {stat: c.model_dump(mode="json", exclude_defaults=True) for stat, (c, _) in per.items()}
                     for n, per in fitted.items()},
        "clusters_for_sequence": {n: {stat: c.model_dump(mode="json", exclude_defaults=True)
                                      for stat, (c, _) in per.items()} for n, per in
                                  ((n, p["sequence"]) for n, p in profiles.items())},
        "profile_drift": {n: p["drift"] for n, p in profiles.items()}, "refused_profiles": refused,
        "model": MODELS[args.model].model_dump(mode="json"), "load_average_before": load_before, "load_average_after": load_after}, indent=1))
    picture = draw_calibration(json.loads(args.out.read_text()), args.out.with_suffix(".png"))
    console.print(f"wrote {args.out} and {picture} (work files in {folder})", highlight=False)


if __name__ == "__main__":
    main()
