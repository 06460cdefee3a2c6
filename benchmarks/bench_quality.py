"""Heuristic quality against the exact path (issue 4).

For every bundled problem small enough (--max-devices), the exact solver (`cpsat` through
`solvers.registry`) runs once and its result is cached in `benchmarks/exact_cache.json`
(keyed by the problem's content hash and a hash of the exact solvers' and planner's code, so
an edited problem or solver is solved again). Where the
exact path *proves* the optimum, the heuristic's gap is (T_heuristic − T*) / T*; targets:
every gap ≤ 3 %, mean ≤ 1 %. Where it only has an incumbent and a bound, the table shows
the heuristic against both but the row does not count (an unproven optimum is not faked).
Note: the exact driver warm-starts from the heuristic's plan, so an unproven incumbent is
not independent of the heuristic; only proven optima (and bounds) are.

    .venv/bin/python benchmarks/bench_quality.py [--max-devices 16] [--exact-time-limit 300]
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.io import bundled_names, load_problem  # noqa: E402
from solvers import registry  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402

CACHE = ROOT / "benchmarks" / "exact_cache.json"
MAX_GAP, MAX_MEAN_GAP = 0.03, 0.01


def problem_hash(problem) -> str:
    return hashlib.sha256(problem.model_dump_json().encode()).hexdigest()[:16]


def code_hash() -> str:
    """Of the exact solvers and the cost model: a cached result from other code is stale."""
    files = sorted((ROOT / "solvers" / "exact").glob("*.py")) + sorted((ROOT / "planner").glob("*.py"))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


def exact_result(problem, solver: str, time_limit: float, cache: dict, refresh: bool) -> dict:
    key = f"{problem.name}/{solver}"
    entry = cache.get(key)
    fresh = entry and entry["hash"] == problem_hash(problem) and entry.get("code") == code_hash()
    if fresh and not refresh:
        return entry
    result = registry.solve(problem, solver, SolverOptions(time_limit_s=time_limit))
    entry = {"hash": problem_hash(problem), "code": code_hash(), "status": result.status.value, "objective_s": result.objective_s,
             "bound_s": result.bound_s, "wall_s": result.wall_s, "time_limit_s": time_limit,
             "restrictions": list(result.restrictions)}
    cache[key] = entry
    CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return entry


def main(max_devices: int = typer.Option(16, help="only problems with at most this many GPUs"),
         exact: str = typer.Option("cpsat", help="registered exact solver"),
         exact_time_limit: float = typer.Option(300.0, help="exact solver budget per problem, s"),
         refresh: bool = typer.Option(False, help="ignore the cache and solve again")) -> None:
    console = Console(width=150)
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    table = Table(title=f"heuristic vs {exact} (optimum proven where status is optimal)")
    for col in ("problem", "GPUs", f"{exact} status", "T* / incumbent s", "bound s", "heuristic s",
                "gap %", "heuristic wall s"):
        table.add_column(col, justify="right")
    gaps = []
    for name in bundled_names("problems"):
        problem = load_problem(name)
        if problem.cluster.num_devices > max_devices:
            continue
        console.print(f"{name}: exact …", highlight=False)
        ex = exact_result(problem, exact, exact_time_limit, cache, refresh)
        start = time.perf_counter()
        heur = registry.solve(problem, "heuristic", SolverOptions())
        wall = time.perf_counter() - start
        t, opt = heur.objective_s, ex["objective_s"]
        proven = ex["status"] == "optimal"
        gap = (t - opt) / opt if (proven and opt) else None
        if gap is not None:
            gaps.append(gap)
        bound = ex["bound_s"]
        vs = f"{100 * gap:.3f}" if gap is not None else (
            f"({100 * (t - opt) / opt:+.2f} vs incumbent, ≤ {100 * (t - bound) / bound:.1f} above bound)"
            if opt and bound else "—")
        table.add_row(name, str(problem.cluster.num_devices), ex["status"],
                      f"{opt:.5g}" if opt else "—", f"{ex['bound_s']:.5g}" if ex["bound_s"] else "—",
                      f"{t:.5g}", vs, f"{wall:.2f}")
    console.print(table)
    if not gaps:
        console.print("[red]no problem was proven optimal by the exact path: nothing to compare[/]")
        raise typer.Exit(1)
    worst, mean = max(gaps), sum(gaps) / len(gaps)
    ok = worst <= MAX_GAP and mean <= MAX_MEAN_GAP
    console.print(f"{len(gaps)} proven problems: max gap {100 * worst:.3f} %, mean {100 * mean:.3f} % "
                  f"(targets ≤ {100 * MAX_GAP:.0f} %, ≤ {100 * MAX_MEAN_GAP:.0f} %): "
                  + ("[green]met[/]" if ok else "[red]missed[/]"))


if __name__ == "__main__":
    typer.run(main)
