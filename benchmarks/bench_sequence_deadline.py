"""The sequence heuristic against its time limit at 1,024 to 100,000 GPUs (issue 29).

Generates each cluster as `hexiscale generate problem --gpus N --model llama2-70b --seed 1`
does (same mix, same seed), then runs the `heuristic` of kind sequence under each limit in a
fresh process (no warm caches), and prints per run the limit, the solve's wall time, how far
past the limit it ran, whether that is within the allowance (+5 % or +0.2 s, whichever is
larger), the status and the T found, and where the plan started. Before issue 29 a 2.5 s
limit took 12.3 s at 4,096 GPUs and a 5 s limit 83 s at 16,384.

    .venv/bin/python benchmarks/bench_sequence_deadline.py [--sizes 1024,4096,16384,100000] [--limits 2.5,5,10,30]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
MIX = "A100-80G:0.25,RTX4090:0.5,H20:0.25"  # `hexiscale generate problem`'s default mix
SIZES = (1024, 4096, 16384, 100000)
LIMITS = (2.5, 5.0, 10.0, 30.0)


def allowance(limit: float) -> float:
    """How far past its limit a solve may run: 5 % or 0.2 s, whichever is larger."""
    return max(0.05 * limit, 0.2)


def one_run(gpus: int, limit: float) -> dict:
    """Generate the problem, solve it under `limit`, report the solve's own wall time."""
    sys.path.insert(0, str(ROOT))
    from instances.generate import generate_cluster, generated_problem
    from solvers.common import SolverOptions
    from solvers.registry import solve

    problem = generated_problem(generate_cluster(gpus, MIX, seed=1), "llama2-70b")
    start = time.perf_counter()
    result = solve(problem, "heuristic", SolverOptions(time_limit_s=limit), kind="sequence")
    wall = time.perf_counter() - start
    return {"gpus": gpus, "limit": limit, "wall": wall, "status": result.status.value,
            "t": result.objective_s, "message": result.message}


def in_child(gpus: int, limit: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", str(gpus), str(limit)], capture_output=True,
                         text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table_of(rows: list[dict]) -> Table:
    table = Table(title="sequence heuristic: wall time vs --time-limit (llama2-70b, seed 1)")
    for name in ("GPUs", "limit s", "wall s", "past s", "in time", "status", "T s", "plan"):
        table.add_column(name, justify="left" if name in ("status", "plan") else "right")
    for r in rows:
        past = r["wall"] - r["limit"]
        t = "—" if r["t"] is None else f"{r['t']:,.1f}"
        table.add_row(f"{r['gpus']:,}", f"{r['limit']:g}", f"{r['wall']:.2f}", f"{past:+.2f}",
                      "yes" if past <= allowance(r["limit"]) else "NO", r["status"], t, r["message"].split(";")[0])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="GPU counts, comma separated")
    parser.add_argument("--limits", default=",".join(f"{x:g}" for x in LIMITS), help="time limits in s")
    parser.add_argument("--one", nargs=2, metavar=("GPUS", "LIMIT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(int(args.one[0]), float(args.one[1]))))
        return
    rows = []
    for gpus in (int(x) for x in args.sizes.split(",")):
        for limit in (float(x) for x in args.limits.split(",")):
            rows.append(in_child(gpus, limit))
            print(f"{gpus} GPUs, limit {limit:g} s: {rows[-1]['wall']:.2f} s", file=sys.stderr, flush=True)
    Console(width=160).print(table_of(rows))


if __name__ == "__main__":
    main()
