"""The tables `bench_calibration.py` prints and writes: predicted against measured step time,
fitted against direct link bandwidth, and each TP stage's and sequence replica's time split
as the runs timed it against the cost model's parts."""

from __future__ import annotations

from rich.table import Table

from planner.layered.pricing import breakdown
from planner.layered.table import stage_table
from planner.sequence.plan import SeqPlan
from planner.sequence.pricing import time_parts
from planner.sequence.table import MemberTable
from runtime.profiling.fit import WRITTEN_OP

STATS = ("mean", "median")  # of repetitions and steps: the mean (the default), and the median
KEYS = {"profile": "after profile", "steady": "after profile, probe-scaled", "calibrated": "after hold-out calibrate",
        "profile_sim": "after profile, schedule simulated", "calibrated_sim": "after hold-out calibrate, schedule simulated"}
# the table's column per key: T of §3.3 (the objective), and T with the schedule simulated (`evaluate`'s simulated_s)
COLUMNS = {"profile": "profile", "steady": "probe-scaled", "calibrated": "hold-out", "profile_sim": "profile sim",
           "calibrated_sim": "hold-out sim"}


def error(row: dict, key: str, stat: str) -> float:
    return row[f"{key}_{stat}"] / row[f"measured_{stat}"] - 1.0


def result_table(rows: list[dict], summed: dict) -> Table:
    table = Table(title="step time: measured (steps after the warm-up) against the cost model's T")
    table.add_column("cluster")
    table.add_column("plan")
    table.add_column("spread", justify="right")
    for stat in STATS:
        for column in (f"{stat} ms", *COLUMNS.values()):
            table.add_column(column, justify="right")
    for r in rows:
        cells = []
        for stat in STATS:
            cells += [f"{r[f'measured_{stat}'] * 1e3:.1f}", *(f"{error(r, key, stat):+.1%}" for key in KEYS)]
        table.add_row(r["cluster"], r["plan"], f"{r['spread']:.0%}", *cells)
    lines = []
    for subset, per_stat in summed.items():
        for stat, per_key in per_stat.items():
            for key, label in KEYS.items():
                got = per_key[key]
                lines.append(f"{subset}, {stat}, {label}: mean |error| {got['mean']:.1%}, worst {got['worst']:.1%} "
                             f"({got['n']} runs)")
    table.caption = "\n".join(lines)
    return table


def link_table(fitted: dict) -> tuple[Table, list[dict]]:
    """Each operation's own fit against its largest message's direct bandwidth; the written
    figure is the all-reduce fit."""
    table = Table(title="fitted link bandwidth against a direct large-message measurement (same operation)")
    for column in ("cluster", "class", "statistic", "operation", "direct GB/s", "fit GB/s", "diff", "fit α µs"):
        table.add_column(column, justify="right")
    out = []
    for name, per_stat in fitted.items():
        for stat, (_, reports) in per_stat.items():
            for link_class, r in reports.items():
                for op, (direct, nbytes) in r.direct.items():
                    fit = r.per_op[op]
                    bw, lat = (float("nan"),) * 2 if isinstance(fit, str) else (fit.bw_gbps, fit.latency_us)
                    written = op == WRITTEN_OP
                    out.append({"cluster": name, "class": link_class, "statistic": stat, "op": op, "written": written,
                                "direct": direct, "fit": bw, "latency_us": lat, "bytes": nbytes})
                    table.add_row(name, link_class, stat, f"{op}{' (written)' if written else ''}", f"{direct:.3f}",
                                  f"{bw:.3f}", f"{bw / direct - 1:+.1%}", f"{lat:.0f}")
    return table, out


def tp_split(rows: list[dict], stat: str = "mean") -> tuple[Table, list[dict]]:
    """Each TP stage's τ split as the run timed it (its TP collectives apart) against the cost
    model's C and T_tp on the profiled cluster: where a TP plan's miss comes from."""
    table = Table(title=f"TP stages ({stat}, per micro-batch): compute and TP collectives, measured against the profile's C and T_tp")
    for column in ("cluster", "plan", "stage", "compute ms", "C ms", "diff", "TP ms", "T_tp ms", "diff"):
        table.add_column(column, justify="right")
    out = []
    for row in rows:
        record = row[f"record_{stat}"]
        if not record.tp_stages():
            continue
        parts = breakdown(record.problem, stage_table(record.problem, record.plan))
        for i in record.tp_stages():
            compute, tp = record.stage_s[i] - record.tp_s[i], record.tp_s[i]
            out.append({"cluster": row["cluster"], "plan": row["plan"], "stage": i, "compute": compute,
                        "C": float(parts.compute[i]), "tp": tp, "T_tp": float(parts.tp[i])})
            table.add_row(row["cluster"], row["plan"], str(i), f"{compute * 1e3:.1f}", f"{parts.compute[i] * 1e3:.1f}",
                          f"{parts.compute[i] / compute - 1:+.0%}", f"{tp * 1e3:.1f}", f"{parts.tp[i] * 1e3:.1f}",
                          f"{parts.tp[i] / tp - 1:+.0%}")
    return table, out


def seq_split(rows: list[dict], stat: str = "mean") -> tuple[Table, list[dict]]:
    """Each sequence replica's T_mb split as the run log records it — head-parallel
    all-to-alls and ZeRO-3 gathers and scatters as its busiest member timed them (the one the
    others wait for: its collectives are transfers, theirs hold the waiting too), the rest —
    against the cost model's parts on the cluster profiled for sequence plans."""
    table = Table(title=f"sequence replicas ({stat}, per micro-batch): measured against the profile's parts")
    for column in ("cluster", "replica", "rest ms", "priced", "HP a2a ms", "priced", "ZeRO ms", "priced"):
        table.add_column(column, justify="right")
    out = []
    for row in rows:
        record = row[f"record_{stat}"]
        if not isinstance(record.plan, SeqPlan):
            continue
        parts = time_parts(record.problem, MemberTable.of(record.plan))
        for r in range(len(record.plan.replicas)):
            hp, zero, priced_hp, priced_zero = (record.hp_s[r], record.zero_s[r], float(parts.hp_micro[r]),
                                                float(parts.zero_micro[r]))
            got = {"cluster": row["cluster"], "replica": r, "rest": record.stage_s[r] - hp - zero,
                   "priced_rest": float(parts.micro_batch[r]) - priced_hp - priced_zero,
                   "hp": hp, "priced_hp": priced_hp, "zero": zero, "priced_zero": priced_zero}
            out.append(got)
            table.add_row(row["cluster"], str(r), *(f"{got[k] * 1e3:.1f}" for k in
                                                    ("rest", "priced_rest", "hp", "priced_hp", "zero", "priced_zero")))
    return table, out
