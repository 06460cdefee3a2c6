"""The exact solvers on the bundled exact-solver targets: status, T, proven bound, gap, wall
time and model size, for CP-SAT and the MILP (HiGHS).

Target (issue 3): on small-8-llama2-7b and small-16-llama2-13b both solvers prove optimality
within 120 s on 2 cores; on medium-32-llama2-13b both return a plan and an honest bound
within the time limit. T is always the evaluator's figure for the returned plan.

    .venv/bin/python benchmarks/bench_exact.py [--time-limit 120] [--problems a,b] [--solvers cpsat,milp]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.layered.pricing import iteration_time  # noqa: E402
from planner.io import load_problem  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.registry import solve  # noqa: E402

PROBLEMS = "small-8-llama2-7b,small-16-llama2-13b,medium-32-llama2-13b"
TARGET_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=TARGET_S, help="per solve, seconds")
    parser.add_argument("--problems", default=PROBLEMS)
    parser.add_argument("--solvers", default="cpsat,milp")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--progress", action="store_true", help="show each solver's progress")
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"exact solvers, time limit {args.time_limit:g} s, {args.threads} threads")
    for col in ("problem", "GPUs", "solver", "status", "T s", "bound s", "gap", "wall s", "vars", "cons", "note"):
        table.add_column(col, justify="left" if col in ("problem", "solver", "status", "note") else "right")
    for name in args.problems.split(","):
        problem = load_problem(name)
        for solver in args.solvers.split(","):
            console.print(f"[dim]{name} / {solver} …[/]")
            options = SolverOptions(time_limit_s=args.time_limit, threads=args.threads, progress=args.progress)
            result = solve(problem, solver, options)
            t = iteration_time(problem, result.plan) if result.plan is not None else None
            size = result.model_size
            status = result.status.value
            style = "green" if status == "optimal" else "yellow"
            table.add_row(name, str(problem.cluster.num_devices), solver, f"[{style}]{status}[/]",
                          _f(t, ".5g"), _f(result.bound_s, ".5g"), _f(result.gap, ".2%"), f"{result.wall_s:.1f}",
                          f"{size.variables:,}" if size else "—", f"{size.constraints:,}" if size else "—",
                          "; ".join((*result.restrictions, result.message)).strip("; "))
    console.print(table)


def _f(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
