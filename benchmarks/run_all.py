"""`make bench`: the solver comparison on the paper's settings, the scaling run, the
mixed-vendor tables (bench_vendor: vendor.json), the proven gaps of sequence plans
(bench_sequence_bounds: report/sequence_bounds.md), the proven gaps of layered plans
(bench_bounds: report/bounds.md), and a markdown report with tables and plots
in benchmarks/report/ (README.md + PNGs).

    .venv/bin/python benchmarks/run_all.py [--quick] [--time-limit 60] [--sizes 64,128,256,512,1024]

`--quick` runs two problems and two cluster sizes (a smoke run of the whole pipeline), two
long-context suites and three sequence lengths.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_bounds  # noqa: E402
import bench_compare  # noqa: E402
import bench_sequence  # noqa: E402
import bench_sequence_bounds  # noqa: E402
import bench_seqlen  # noqa: E402
import bench_vendor  # noqa: E402
from hexiscale.cli.compare import ComparisonRow  # noqa: E402
import scaling_report  # noqa: E402
from report_figures import draw_plan_pictures, draw_scaling, draw_speedups  # noqa: E402
from report_text import write_report  # noqa: E402
from solvers.registry import SOLVERS  # noqa: E402

REPORT = Path(__file__).parent / "report"
QUICK_PROBLEMS = ["case-study-llama2-13b", "homo-a800-2x8-llama2-13b"]
QUICK_SEQUENCE_SUITES = ["longctx-sim-32-llama3-8b-128k", "longctx-h100-a100-llama3-8b-64k"]


def sequence_runs(quick: bool, time_limit: float) -> dict:
    """The long-context section's data: the sequence heuristic against its baselines on the
    simulated suites (bench_sequence) and the sequence-length table (bench_seqlen)."""
    suites = bench_sequence.suite_rows(QUICK_SEQUENCE_SUITES if quick else None)
    lengths = bench_seqlen.QUICK_LENGTHS if quick else bench_seqlen.LENGTHS
    seqlen = bench_seqlen.run(lengths, time_limit)
    bench_sequence.console.print(bench_sequence.quality_table(suites))
    bench_sequence.console.print(bench_seqlen.seqlen_table(seqlen))
    matched = bench_sequence.flop_matched_rows(bench_sequence.FLOP_MATCHED[:1] if quick else None)
    bench_sequence.console.print(bench_sequence.flop_matched_table(matched))
    return {"suites": suites, "seqlen": [r.model_dump() for r in seqlen], "flop_matched": matched}


def _git_head() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two problems, two sizes")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per heuristic-like run")
    parser.add_argument("--exact-time-limit", type=float, default=30.0, help="seconds per cpsat/milp run")
    parser.add_argument("--sizes", default="64,128,256,512,1024", help="cluster sizes of the scaling run")
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--commit", default="", help="the code version to name in the report (git hash)")
    parser.add_argument("--render-only", action="store_true",
                        help="rebuild README and figures from the saved compare.json / scaling.json")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.render_only:
        rows = [ComparisonRow(**r) for r in json.loads((args.out / "compare.json").read_text())]
        scaling = [scaling_report.ScalingRow(**r) for r in json.loads((args.out / "scaling.json").read_text())]
        saved = args.out / "sequence.json"
        sequence = json.loads(saved.read_text()) if saved.exists() else None
    else:
        problems = QUICK_PROBLEMS if args.quick else bench_compare.HETERO + bench_compare.HOMO
        sizes = "64,128" if args.quick else args.sizes
        rows = bench_compare.main(["--problems", ",".join(problems), "--time-limit", str(args.time_limit),
                                   "--exact-time-limit", str(args.exact_time_limit), "--out", str(args.out)])
        scaling = scaling_report.main(["--sizes", sizes, "--time-limit", "600"])
        (args.out / "scaling.json").write_text(json.dumps([r.model_dump() for r in scaling], indent=2) + "\n")
        sequence = sequence_runs(args.quick, args.time_limit)
        (args.out / "sequence.json").write_text(json.dumps(sequence, indent=2) + "\n")
        vendor = bench_vendor.run(min(args.time_limit, 20.0), [1.0] if args.quick else [1.0, 16.0])
        (args.out / "vendor.json").write_text(json.dumps(vendor, indent=2) + "\n")
        # proven gaps of sequence plans on the 32-GPU long-context suite: its own report page
        bench_sequence_bounds.run(bench_sequence_bounds.QUICK if args.quick else bench_sequence_bounds.SUITE,
                                  120.0 if args.quick else 600.0, args.out)
        # proven gaps of layered plans (configuration bound, docs/bounds.md): report/bounds.md
        bench_bounds.main(["--heuristic-limit", "10", "--bound-limit", "60" if args.quick else "600",
                           "--problems", ",".join(problems), "--generated", "" if args.quick else "24,40,64",
                           "--big", "" if args.quick else "128", "--big-seeds", "5",
                           "--default-limit", "0" if args.quick else "60"])
    figures = {
        "speedups": draw_speedups(rows, args.out / "speedup.png"),
        "scaling": draw_scaling(scaling, args.out / "scaling.png"),
        "plans": draw_plan_pictures(rows, args.out / "plans", args.out / "pictures"),
    }
    context = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {platform.python_version()}, 2 shared CPU cores",
        "time_limit": args.time_limit, "exact_time_limit": args.exact_time_limit,
        "wall_s": time.perf_counter() - start, "quick": args.quick, "render_only": args.render_only,
        "missing": [s for s in bench_compare.SOLVER_ORDER if s not in SOLVERS],
        "commit": args.commit or _git_head(),
    }
    path = write_report(rows, scaling, figures, context, args.out / "README.md", sequence=sequence)
    print(f"report: {path} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
