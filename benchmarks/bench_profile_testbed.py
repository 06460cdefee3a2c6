"""`profile` across emulated machines against the shaping (issue 32, docs/calibration.md §9,
docs/testbed.md): the fitted inter-machine bandwidth against the rate the link is shaped to,
and the fitted latency against direct small-message timings.

    .venv/bin/python benchmarks/bench_profile_testbed.py [--rates 200 800] [--repeats 3]

tiny-2 as two namespaces with its link shaped to each `--rates` Mbit/s; each profile runs 2
processes on the first machine (intra: its loopback) and 1 on the second (inter: the link),
messages up to 32 MiB, `--repeats` times. Per profile: the written (all-reduce) fit's bandwidth
and α per class, the direct 4-byte α the profile times beside its fit (same operation, same
conditions: after the compute gap, the other rank computing), and, measured right after in two
processes of their own (`runtime.profiling.round_trip`), a 4-byte gloo all-reduce's α back to
back and a raw TCP one-way time (what the network takes without gloo). Medians over the
repetitions in the summary: the host's 2 cores are shared with other work. Writes
benchmarks/report/profile_testbed.json and .md, and benchmarks/report/profile_testbed_sizes.md
(the first profile's all-reduce times by message size against x/rate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402

from planner.calibration import CalibrationError, term_regressors  # noqa: E402
from planner.io import load_cluster, load_model  # noqa: E402
from runtime.profiling.fit import drift, priced_term, profiled_cluster  # noqa: E402
from runtime.profiling.launcher import ProfileSpec  # noqa: E402
from runtime.profiling.testbed import direct_latencies, profile_on_testbed  # noqa: E402
from runtime.testbed import Testbed, unavailable_reason  # noqa: E402
from runtime.testbed.layout import MBIT_PER_GBPS  # noqa: E402

console = Console(width=150)
SPEC = ProfileSpec(machines=(2, 1), model=load_model("tiny"), seq_len=128, micro_batch=1, max_bytes=1 << 25, repeats=5)


def one_profile(bed: Testbed, folder: Path, statistic: str) -> dict:
    result = profile_on_testbed(bed, SPEC, folder)
    row = {"drift": drift(result), "sizes": by_size(result, statistic)}
    try:
        _, reports, _ = profiled_cluster(result, name="tb", gpu_name="cpu", statistic=statistic)
    except CalibrationError as exc:
        return row | {"refused": str(exc)}
    for name, report in reports.items():
        row[name] = {"bw_gbps": report.written.bw_gbps, "alpha_us": report.written.latency_us,
                     "direct_alpha_us": report.direct_latency_us.get("all_reduce"),
                     "direct_p2p_us": report.direct_latency_us.get("p2p")}
    beside = direct_latencies(bed, SPEC)
    return row | {"beside_all_reduce_us": beside["all_reduce"]["median_us"], "tcp_us": beside["tcp"]["median_us"],
                  "beside_p2p_us": beside["p2p"]["median_us"]}


def by_size(result, statistic: str) -> list[dict]:
    """The inter-machine all-reduce of every message size: its time and the bytes its cost term
    moves (2(n − 1)/n·x), from which x/rate follows for any rate."""
    timings = sorted((t for t in result.links if t.link_class == "inter" and t.op == "all_reduce"),
                     key=lambda t: t.nbytes)
    return [{"bytes": t.nbytes, "moved_bytes": float(term_regressors(priced_term(t))[0]) * 1e9,
             "time_s": t.summary(statistic)} for t in timings]


def sizes_markdown(data: dict) -> str:
    """Per rate, the first profile's all-reduce times against x/rate (docs/calibration.md §9: a message
    costs max(2α, x/rate) on a token-bucket link)."""
    lines = ["# Inter-machine all-reduce times by message size on the shaped testbed link\n",
             f"`benchmarks/bench_profile_testbed.py` (statistic {data['statistic']}), the first profile at each "
             "rate: a 2-rank all-reduce across the link; x/rate is the bytes its cost term moves over the shaped "
             "rate. What it shows: docs/calibration.md §9.\n"]
    for rate, s in data["rates"].items():
        first = next((r for r in s["runs"] if r.get("sizes")), None)
        if first is None:
            continue
        bytes_per_s = float(rate) * 1e6 / 8
        lines += [f"## {rate} Mbit/s\n", "| bytes | time ms | x/rate ms | ratio |", "|---:|---:|---:|---:|"]
        lines += [f"| {z['bytes']} | {z['time_s'] * 1e3:.3f} | {z['moved_bytes'] / bytes_per_s * 1e3:.3f} | "
                  f"{z['time_s'] * bytes_per_s / z['moved_bytes']:.2f} |" for z in first["sizes"]]
        lines.append("")
    return "\n".join(lines)


def summary(rows: list[dict], shaped_gbps: float) -> dict:
    good = [r for r in rows if "inter" in r]
    if not good:
        return {"refused": len(rows)}
    med = lambda values: statistics.median(values)  # noqa: E731
    inter_bw, alpha = med([r["inter"]["bw_gbps"] for r in good]), med([r["inter"]["alpha_us"] for r in good])
    direct = med([r["inter"]["direct_alpha_us"] for r in good])
    return {"inter_bw_gbps": inter_bw, "bw_error": inter_bw / shaped_gbps - 1, "alpha_us": alpha,
            "direct_alpha_us": direct, "alpha_error": alpha / direct - 1, "tcp_us": med([r["tcp_us"] for r in good]),
            "beside_all_reduce_us": med([r["beside_all_reduce_us"] for r in good]),
            "intra_bw_gbps": med([r["intra"]["bw_gbps"] for r in good]), "profiles": len(good),
            "refused": len(rows) - len(good)}


def markdown(data: dict) -> str:
    lines = ["# `profile` across emulated machines\n",
             f"`benchmarks/bench_profile_testbed.py`: tiny-2 as two namespaces, 2 processes on the first machine "
             f"and 1 on the second, messages to 32 MiB, {data['repeats']} profiles per rate, statistic "
             f"{data['statistic']}; medians over the profiles (the host's 2 cores are shared with other work).\n",
             "| shaped Mbit/s | fitted inter GB/s | against the shaping | fitted α µs (all-reduce) | direct 4 B α µs "
             "(in the profile) | α against direct | 4 B all-reduce α back to back µs | raw TCP one way µs | "
             "intra GB/s | profiles (refused) |", "|" + "---|" * 10]
    for rate, s in data["rates"].items():
        if "inter_bw_gbps" not in s:
            lines.append(f"| {rate} | refused ({s['refused']}) |" + " |" * 8)
            continue
        lines.append(f"| {rate} | {s['inter_bw_gbps']:.4f} | {s['bw_error']:+.1%} | {s['alpha_us']:.0f} | "
                     f"{s['direct_alpha_us']:.0f} | {s['alpha_error']:+.0%} | {s['beside_all_reduce_us']:.0f} | "
                     f"{s['tcp_us']:.1f} | {s['intra_bw_gbps']:.3f} | {s['profiles']} ({s['refused']}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[200.0, 800.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--statistic", default="median")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "report" / "profile_testbed.json")
    args = parser.parse_args()
    if (reason := unavailable_reason()) is not None:
        console.print(f"error: {reason}", highlight=False)
        sys.exit(1)
    cluster, folder, data = load_cluster("tiny-2"), Path(tempfile.mkdtemp(prefix="bench-profile-testbed-")), {}
    for rate in args.rates:
        with Testbed(cluster, scale=rate / (cluster.inter_bw_gbps * MBIT_PER_GBPS)) as bed:
            rows = [one_profile(bed, folder / f"{rate:.0f}-{i}", args.statistic) for i in range(args.repeats)]
        data[f"{rate:.0f}"] = {"runs": rows, **summary(rows, rate / MBIT_PER_GBPS)}  # summary's "profiles" is a count
        console.print(f"{rate:.0f} Mbit/s: " + json.dumps({k: v for k, v in data[f'{rate:.0f}'].items()
                                                          if k != "runs"}), highlight=False)
    out = {"repeats": args.repeats, "statistic": args.statistic, "rates": data}
    args.out.write_text(json.dumps(out, indent=1))
    args.out.with_suffix(".md").write_text(markdown(out))
    args.out.with_name(args.out.stem + "_sizes").with_suffix(".md").write_text(sizes_markdown(out))
    console.print(markdown(out), highlight=False)


if __name__ == "__main__":
    main()
