"""Heuristic speed and plan quality against cluster size (issue 4).

Generated clusters (`instances.generate.generate_cluster`) of 128 … 100,000 GPUs, Llama-2
70B, one sequence of 4096 tokens per GPU per iteration. Per size the problem is written to a
JSON file first (YAML reads about 10× slower at 10^5 GPUs); then, as `hexiscale solve` does, it is loaded from that file and solved:
load and solve wall time, peak memory, the plan's D, stages, devices used, tokens/s and MFU
by the evaluator, and the wall time of `validate` and `evaluate` on the plan.
Targets: 1024 GPUs ≤ 10 s, 4096 GPUs ≤ 60 s, 100,000 GPUs ≤ 60 s load + solve, peak memory
≤ 2 GiB; MFU at 100,000 ≥ 90 % of the MFU at 4096; validate and evaluate ≤ 2 s each.

    .venv/bin/python benchmarks/bench_scaling.py [--sizes 128,256] [--mix ...] [--seed 0]
    .venv/bin/python benchmarks/bench_scaling.py --sizes 4096,16384,32768,100000
    .venv/bin/python benchmarks/bench_scaling.py --sizes large --time-limit 5,10,30,60

Several limits (`--time-limit 5,10,30,60`) give one row per size and limit: the limit is a
promise (solve ≤ 1.1 × limit), and the 10 s plan should be within 5 % of the 60 s plan.

Each size runs in a fresh subprocess so that peak memory (ru_maxrss) is that size's own.
`--pipelines 64,128` restricts the D the heuristic tries (to time the rest of the search).
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
LARGE = "16384,32768,100000"  # --sizes large
MIX = "A100-80G:0.3,H800:0.2,H20:0.2,RTX4090:0.15,L40S:0.15"


def measure(gpus: int, mix: str, seed: int, time_limit: float, pipelines: str = "") -> dict:
    """One size, in this process: write the problem file, then load, solve, validate, price."""
    import tempfile

    from instances.generate import generate_cluster, generated_problem, write_problem
    from planner.io import load_problem
    from planner.layered.evaluate import evaluate
    from planner.layered.validate import validate
    from solvers.common import SolverOptions
    from solvers.layered.heuristic import solve
    from solvers.layered.heuristic.options import HeuristicOptions
    from solvers.layered.heuristic.search import solve_with

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"gen-{gpus}.json"
        write_problem(generated_problem(generate_cluster(gpus, mix, seed=seed), "llama2-70b", seq_len=4096), path)
        size_mib = path.stat().st_size / 2**20
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        problem = load_problem(path)
        load = time.perf_counter() - start
    options = SolverOptions(seed=seed, time_limit_s=time_limit)
    start = time.perf_counter()
    if pipelines:
        result = solve_with(problem, options, HeuristicOptions(pipelines=tuple(int(x) for x in pipelines.split(","))))
    else:
        result = solve(problem, options)
    wall = time.perf_counter() - start
    plan = result.plan
    start = time.perf_counter()
    violations = validate(problem, plan)
    validate_s = time.perf_counter() - start
    start = time.perf_counter()
    estimate = evaluate(problem, plan)
    evaluate_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"gpus": gpus, "file_mib": size_mib, "load_s": load, "wall_s": wall, "peak_mib": peak / 1024,
            "base_mib": base / 1024, "pipelines": len(plan.pipelines), "stages": plan.num_stages,
            "used": len(plan.devices), "iteration_s": estimate.iteration_s, "tokens_per_s": estimate.tokens_per_s,
            "mfu": estimate.mfu, "validate_s": validate_s, "evaluate_s": evaluate_s, "valid": not violations,
            "limit_s": time_limit}


def main(sizes: str = typer.Option(SIZES, help="comma-separated GPU counts, or 'large' for " + LARGE),
         mix: str = typer.Option(MIX, help="GPU type mix, TYPE:WEIGHT,..."),
         seed: int = typer.Option(0),
         time_limit: str = typer.Option("120", help="solver budget(s), s: one, or several as 5,10,30,60"),
         pipelines: str = typer.Option("", help="D candidates for the heuristic, e.g. 64,128 (default: its own)"),
         one: int = typer.Option(0, hidden=True)) -> None:
    if one:
        print(json.dumps(measure(one, mix, seed, float(time_limit), pipelines)))
        return
    console = Console(width=180)
    table = Table(title=f"heuristic scaling: Llama-2 70B, mix {mix}, seed {seed}")
    for col in ("GPUs", "limit s", "file MiB", "load s", "solve s", "load+solve s", "peak MiB", "D", "stages", "used",
                "T s", "tokens/s", "MFU", "validate s", "evaluate s"):
        table.add_column(col, justify="right")
    for gpus in (int(x) for x in (LARGE if sizes == "large" else sizes).split(",")):
        for limit in time_limit.split(","):
            r = _run_one(console, gpus, mix, seed, limit, pipelines)
            if r is not None:
                table.add_row(str(gpus), f"{r['limit_s']:g}", f"{r['file_mib']:.2f}", f"{r['load_s']:.2f}",
                              f"{r['wall_s']:.2f}", f"{r['load_s'] + r['wall_s']:.2f}", f"{r['peak_mib']:.0f}",
                              str(r["pipelines"]), str(r["stages"]), str(r["used"]), f"{r['iteration_s']:.2f}",
                              f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f} %", f"{r['validate_s']:.3f}",
                              f"{r['evaluate_s']:.3f}")
    console.print(table)


def _run_one(console, gpus: int, mix: str, seed: int, limit: str, pipelines: str) -> dict | None:
    """One size and limit in a fresh subprocess (its own peak memory)."""
    out = subprocess.run([sys.executable, __file__, "--one", str(gpus), "--mix", mix, "--seed", str(seed),
                          "--time-limit", limit, "--pipelines", pipelines],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        console.print(f"[red]{gpus} GPUs failed:[/] {out.stderr.strip().splitlines()[-1:]}")
        return None
    r = json.loads(out.stdout.strip().splitlines()[-1])
    console.print(f"{gpus} GPUs, limit {limit} s: load {r['load_s']:.2f} s, solve {r['wall_s']:.2f} s, "
                  f"MFU {100 * r['mfu']:.1f} %, D {r['pipelines']}", highlight=False)
    return r


if __name__ == "__main__":
    typer.run(main)
