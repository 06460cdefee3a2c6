"""Heuristic speed and plan quality against cluster size (issue 4).

Generated clusters (`instances.generate.generate_cluster`) of 128 … 4096 GPUs, Llama-2 70B,
one sequence of 4096 tokens per GPU per iteration. Per size: wall time and peak memory of
`solve`, and the plan's D, stages, devices used, tokens/s and MFU by the evaluator.
Targets: 1024 GPUs ≤ 10 s, 4096 GPUs ≤ 60 s, peak memory ≤ 2 GiB; throughput grows with size.

    .venv/bin/python benchmarks/bench_scaling.py [--sizes 128,256] [--mix ...] [--seed 0]

Each size runs in a fresh subprocess so that peak memory (ru_maxrss) is that size's own.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = "128,256,512,1024,2048,4096"
MIX = "A100-80G:0.3,H800:0.2,H20:0.2,RTX4090:0.15,L40S:0.15"


def measure(gpus: int, mix: str, seed: int, time_limit: float) -> dict:
    """One size, in this process: solve and price."""
    from instances.generate import generate_cluster, generated_problem
    from planner.layered.evaluate import evaluate
    from solvers.common import SolverOptions
    from solvers.layered.heuristic import solve

    problem = generated_problem(generate_cluster(gpus, mix, seed=seed), "llama2-70b", seq_len=4096)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    result = solve(problem, SolverOptions(seed=seed, time_limit_s=time_limit))
    wall = time.perf_counter() - start
    estimate = evaluate(problem, result.plan)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    plan = result.plan
    return {"gpus": gpus, "wall_s": wall, "peak_mib": peak / 1024, "base_mib": base / 1024,
            "pipelines": len(plan.pipelines), "stages": plan.num_stages, "used": len(plan.devices),
            "iteration_s": estimate.iteration_s, "tokens_per_s": estimate.tokens_per_s,
            "mfu": estimate.mfu}


def main(sizes: str = typer.Option(SIZES, help="comma-separated GPU counts"),
         mix: str = typer.Option(MIX, help="GPU type mix, TYPE:WEIGHT,..."),
         seed: int = typer.Option(0), time_limit: float = typer.Option(120.0, help="solver budget, s"),
         one: int = typer.Option(0, hidden=True)) -> None:
    if one:
        print(json.dumps(measure(one, mix, seed, time_limit)))
        return
    console = Console(width=150)
    table = Table(title=f"heuristic scaling: Llama-2 70B, mix {mix}, seed {seed}")
    for col in ("GPUs", "wall s", "peak MiB", "D", "stages", "used", "T s", "tokens/s", "MFU"):
        table.add_column(col, justify="right")
    for gpus in (int(x) for x in sizes.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(gpus), "--mix", mix, "--seed", str(seed),
                              "--time-limit", str(time_limit)], capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            console.print(f"[red]{gpus} GPUs failed:[/] {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        table.add_row(str(gpus), f"{r['wall_s']:.2f}", f"{r['peak_mib']:.0f}", str(r["pipelines"]),
                      str(r["stages"]), str(r["used"]), f"{r['iteration_s']:.2f}",
                      f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f} %")
        console.print(f"{gpus} GPUs: {r['wall_s']:.2f} s", highlight=False)
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
