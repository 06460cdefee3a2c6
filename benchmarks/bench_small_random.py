"""Heuristic quality on random small problems nobody chose (instances/random_small.py).

Every seed gives a problem of 2–8 GPUs (every third one tiny: ≤ 5 GPUs, ≤ 6 layers, inside
brute force's reach). The judge is brute force where it reaches, else CP-SAT (and MILP where
CP-SAT does not prove the optimum in its time); judge results are cached in
`benchmarks/small_random_cache.json`, keyed by the problem's content hash and a hash of the
exact solvers' and planner's code, so reruns are cheap. Against every *proven* optimum:
gap = (T_heuristic − T*) / T*; targets worst ≤ 3 %, mean ≤ 1 %, no false infeasible (the
heuristic says `infeasible` where the judge has a plan). Two heuristic settings are shown:
the default (structure moves, then the exact sub-solve with the time left on clusters up to
8 GPUs) and its own search alone (`exact_devices=0`), which is what larger clusters get.

    .venv/bin/python benchmarks/bench_small_random.py [--seeds 300] [--start 0]
        [--time-limit 20] [--exact-time-limit 60]
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

from instances.random_small import random_small  # noqa: E402
from solvers import registry  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.layered.exact import brute  # noqa: E402
from solvers.layered.composed import solve_with  # noqa: E402  (the registry's heuristic: search + exact refinement)
from solvers.layered.heuristic import HeuristicOptions  # noqa: E402

CACHE = ROOT / "benchmarks" / "small_random_cache.json"
MAX_GAP, MAX_MEAN_GAP = 0.03, 0.01


def problem_of(seed: int):
    return random_small(seed, tiny=seed % 3 == 0)


def problem_hash(problem) -> str:
    return hashlib.sha256(problem.model_dump_json().encode()).hexdigest()[:16]


def code_hash() -> str:
    files = (sorted((ROOT / "solvers" / "layered" / "exact").glob("*.py")) + [ROOT / "solvers" / "layered" / "tables.py"]
             + sorted((ROOT / "planner").rglob("*.py")))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


def reachable(problem) -> bool:
    return problem.cluster.num_devices <= brute.MAX_DEVICES and problem.model.layers <= brute.MAX_LAYERS


def judge(problem, time_limit: float) -> dict:
    """Brute force where it reaches, else CP-SAT, else MILP: the first that proves it."""
    names = ["brute"] if reachable(problem) else ["cpsat", "milp"]
    for name in names:
        result = registry.solve(problem, name, SolverOptions(time_limit_s=time_limit))
        if result.status.value in ("optimal", "infeasible"):
            break
    return {"judge": name, "status": result.status.value, "objective_s": result.objective_s,
            "bound_s": result.bound_s, "wall_s": result.wall_s}


def judged(problem, time_limit: float, cache: dict, code: str) -> dict:
    key = f"{problem_hash(problem)}/{code}"
    if key not in cache:
        cache[key] = judge(problem, time_limit)
        CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return cache[key]


SETTINGS = {"default": HeuristicOptions(), "own search": HeuristicOptions(exact_devices=0)}


def run_heuristic(problem, setting: str, time_limit: float) -> dict:
    start = time.perf_counter()
    result = solve_with(problem, SolverOptions(time_limit_s=time_limit), SETTINGS[setting])
    return {"status": result.status.value, "objective_s": result.objective_s, "wall_s": time.perf_counter() - start}


def summary(rows: list[tuple[dict, dict]], time_limit: float) -> list[str]:
    proven = [(j, h) for j, h in rows if j["status"] == "optimal"]
    gaps = [(h["objective_s"] - j["objective_s"]) / j["objective_s"] for j, h in proven if h["objective_s"]]
    no_plan = sum(h["objective_s"] is None for _, h in proven)
    false_inf = sum(h["status"] == "infeasible" and j["status"] != "infeasible" for j, h in rows)
    walls = [h["wall_s"] for _, h in rows]
    worst, mean = (max(gaps), sum(gaps) / len(gaps)) if gaps else (0.0, 0.0)
    return [str(len(rows)), str(len(proven)), str(sum(j["status"] == "infeasible" for j, _ in rows)),
            f"{100 * worst:.3f}", f"{100 * mean:.3f}", str(sum(g > MAX_GAP for g in gaps)), str(no_plan),
            str(false_inf), f"{sum(walls) / len(walls):.2f}", f"{max(walls):.2f}",
            f"{max(walls) / time_limit:.2f}"]


def main(seeds: int = typer.Option(300, help="number of seeds"), start: int = typer.Option(0, help="first seed"),
         time_limit: float = typer.Option(20.0, help="heuristic budget per problem, s"),
         exact_time_limit: float = typer.Option(60.0, help="judge budget per problem and solver, s"),
         verbose: bool = typer.Option(False, help="one line per problem")) -> None:
    console = Console(width=160)
    code = code_hash()  # results of other exact-solver or planner code are dropped
    cache = {k: v for k, v in (json.loads(CACHE.read_text()) if CACHE.exists() else {}).items() if k.endswith(code)}
    rows: dict[str, list] = {s: [] for s in SETTINGS}
    for seed in range(start, start + seeds):
        problem = problem_of(seed)
        truth = judged(problem, exact_time_limit, cache, code)
        for setting in SETTINGS:
            h = run_heuristic(problem, setting, time_limit)
            rows[setting].append((truth, h))
            if verbose:
                gap = (h["objective_s"] / truth["objective_s"] - 1) if h["objective_s"] and truth["objective_s"] else None
                console.print(f"seed {seed} {problem.cluster.num_devices} GPUs {setting}: {truth['judge']} "
                              f"{truth['status']}, heuristic {h['status']}"
                              + (f", gap {100 * gap:.2f} %" if gap is not None else ""), highlight=False)
    table = Table(title=f"heuristic vs proven optima on random small problems (seeds {start}–{start + seeds - 1}, "
                        f"heuristic budget {time_limit:g} s)")
    for col in ("setting", "problems", "proven", "infeasible (proven)", "worst gap %", "mean gap %", "over 3 %",
                "no plan found", "false infeasible", "wall mean s", "wall max s", "max wall / limit"):
        table.add_column(col, justify="right")
    for setting, r in rows.items():
        table.add_row(setting, *summary(r, time_limit))
    judges = {}
    for truth, _ in rows["default"]:
        judges[f"{truth['judge']} {truth['status']}"] = judges.get(f"{truth['judge']} {truth['status']}", 0) + 1
    console.print(table)
    console.print("judges: " + ", ".join(f"{k}: {v}" for k, v in sorted(judges.items())), highlight=False)


if __name__ == "__main__":
    typer.run(main)
