"""Heuristic solve time against cluster size (HexiScale slide 12: 6.7 s at 128 GPUs, 30.1 s at
256, 96.0 s at 512, 372.1 s at 1024, on the authors' machine).

Clusters come from `instances.generate` (a four-type mix, racks, degraded links; seed 0),
the model is Llama-2 70B, one sequence per GPU per iteration. Prints a rich table and
returns the rows for the report; `run_all.py` draws them.

    .venv/bin/python benchmarks/scaling_report.py [--sizes 64,128,256,512,1024] [--time-limit 600]
    .venv/bin/python benchmarks/scaling_report.py --sizes 16384,32768,100000 --solvers heuristic --time-limit 60

Each row also times `validate` and `evaluate` on the plan found (target at 100,000 GPUs: ≤ 2 s each).

(`bench_scaling.py` is the heuristic's own speed/memory benchmark; this one feeds the report.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import Field  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from instances.generate import generate_cluster, generated_problem  # noqa: E402
from planner import evaluate, validate  # noqa: E402
from planner.base import Frozen  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.registry import solve  # noqa: E402

MIX = "A100-80G:0.25,H800:0.25,RTX4090:0.25,H20:0.25"
MODEL = "llama2-70b"
PAPER_SOLVE_S = {128: 6.7, 256: 30.1, 512: 96.0, 1024: 372.1}  # slide 12
PAPER_PFLOPS = {128: 1.6, 256: 3.3, 512: 4.9, 1024: 6.9}  # slide 12, estimated throughput

console = Console()


class ScalingRow(Frozen):
    gpus: int = Field(ge=1)
    solver: str
    status: str
    solve_s: float = Field(ge=0)
    iteration_s: float | None = None
    pflops: float | None = Field(default=None, description="model FLOP/s achieved, 1e15")
    mfu: float | None = None
    pipelines: int | None = None
    validate_s: float | None = Field(default=None, description="wall time of validate on the plan")
    evaluate_s: float | None = Field(default=None, description="wall time of evaluate on the plan")
    message: str = ""


def scale_point(gpus: int, solver: str, time_limit: float) -> ScalingRow:
    problem = generated_problem(generate_cluster(gpus, MIX, seed=0), MODEL)
    start = time.perf_counter()
    result = solve(problem, solver, SolverOptions(time_limit_s=time_limit, seed=0))
    wall = time.perf_counter() - start
    if result.plan is None:
        return ScalingRow(gpus=gpus, solver=solver, status=result.status.value, solve_s=wall, message=result.message)
    start = time.perf_counter()
    validate(problem, result.plan)
    validate_s = time.perf_counter() - start
    start = time.perf_counter()
    est = evaluate(problem, result.plan)
    evaluate_s = time.perf_counter() - start
    achieved = est.mfu * problem.cluster.total_peak_flops / 1e15
    return ScalingRow(gpus=gpus, solver=solver, status=result.status.value, solve_s=wall,
                      iteration_s=est.iteration_s, pflops=achieved, mfu=est.mfu,
                      pipelines=len(result.plan.pipelines), validate_s=validate_s, evaluate_s=evaluate_s,
                      message=result.message)


def scaling_table(rows: list[ScalingRow]) -> Table:
    table = Table(title=f"solve time vs cluster size ({MODEL}, mix {MIX})")
    for col in ("GPUs", "solver", "status", "solve s", "paper s", "T (s)", "PFLOP/s", "paper PFLOP/s", "MFU", "D",
                "validate s", "evaluate s"):
        table.add_column(col, justify="left" if col in ("solver", "status") else "right")
    for r in rows:
        table.add_row(str(r.gpus), r.solver, r.status, f"{r.solve_s:.1f}",
                      f"{PAPER_SOLVE_S[r.gpus]:.1f}" if r.gpus in PAPER_SOLVE_S and r.solver == "heuristic" else "—",
                      "—" if r.iteration_s is None else f"{r.iteration_s:.2f}",
                      "—" if r.pflops is None else f"{r.pflops:.2f}",
                      f"{PAPER_PFLOPS[r.gpus]:.1f}" if r.gpus in PAPER_PFLOPS and r.solver == "heuristic" else "—",
                      "—" if r.mfu is None else f"{r.mfu:.1%}", "—" if r.pipelines is None else str(r.pipelines),
                      "—" if r.validate_s is None else f"{r.validate_s:.3f}",
                      "—" if r.evaluate_s is None else f"{r.evaluate_s:.3f}")
    return table


def main(argv: list[str] | None = None) -> list[ScalingRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,128,256,512")
    parser.add_argument("--solvers", default="heuristic,symmetric")
    parser.add_argument("--time-limit", type=float, default=600.0)
    args = parser.parse_args(argv)
    rows = []
    for gpus in (int(x) for x in args.sizes.split(",")):
        for solver in args.solvers.split(","):
            with console.status(f"{solver} on {gpus} GPUs …"):
                rows.append(scale_point(gpus, solver, args.time_limit))
            console.print(f"  {gpus} GPUs, {solver}: {rows[-1].solve_s:.1f} s", highlight=False)
    console.print(scaling_table(rows))
    return rows


if __name__ == "__main__":
    main()
