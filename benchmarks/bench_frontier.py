"""The heuristic's time–rent frontier against the exact solver's, per budget level, and the
1,024-GPU frontier command's wall time (docs/frontier.md).

Part 1 — for each problem (the bundled offers problem and generated 64-GPU priced clusters,
`generate_cluster(..., prices)` as `hexiscale generate cluster --prices` writes them) and each of
`--levels` budgets (geometric from the cheapest rent that can hold the model states to the whole
cluster's, as `hexiscale frontier` picks them): the heuristic under the budget (`--heuristic-s`),
then CP-SAT under the same budget (`--exact-s`; rented_M and the budget in the model, warm-started
from the heuristic's plan within the budget). Columns: the heuristic's T, the exact solver's T
and status, the proven lower bound at that budget, the heuristic's excess over the exact T and
its gap to the bound (the larger of CP-SAT's and the configuration bound's, docs/bounds.md [U6],
`--bound-s`); "within 3 %" holds where the heuristic's T is within 3 % of the proven
optimum or, where none is proven, of the best proven bound.

Part 2 — `hexiscale frontier` (the installed command, so start-up counts) with 10 budget levels
on a generated 1,024-GPU priced cluster, -t 60: the whole command's wall time.

    .venv/bin/python benchmarks/bench_frontier.py [--levels 6] [--heuristic-s 20] [--exact-s 60] [--bound-s 120]
        [--problems offers-llama2-13b,gen64-s0,gen64-s1,gen64-s3] [--skip-large] [--reuse] [--redo-bound]
        [--redo-levels 48.03,24.99]
        [--out benchmarks/report/frontier.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from instances.generate import generate_cluster, generated_problem, write_problem  # noqa: E402
from instances.price_table import priced  # noqa: E402
from planner.io import load_problem  # noqa: E402
from planner.kinds import iteration_time  # noqa: E402
from planner.prices import rent_per_hour  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.frontier import at_budget, budget_levels, frontier  # noqa: E402
from solvers.layered.bound.budget_sets import budget_bound  # noqa: E402
from solvers.layered.composed import solve_heuristic  # noqa: E402
from solvers.objective import solve_on_set  # noqa: E402
from solvers.rental import maximal_sets  # noqa: E402
from solvers.registry import get  # noqa: E402

MIX = "A100-80G:0.25,H800:0.25,RTX4090:0.25,H20:0.25"
WITHIN = 0.03
COLUMNS = ("problem", "budget/h", "heur. T s", "heur. rent/h", "exact T s", "exact status", "CP-SAT bound s",
           "config. bound: whole menu s", "config. bound: by sets s (sets)", "config. bound s", "bound s",
           "heur. vs exact", "heur. gap to bound", "within 3 %", "maximal sets", "heur. on every set: T s",
           "heur. vs every set")
MAX_SETS = 24  # the heuristic is run on every maximal set up to this many
EXACT_SET_DEVICES = 32  # CP-SAT refines the least set's bound up to this many devices (compare's default)
OFFERS_LIMIT_S = 120.0  # the offers frontier's limit (the command's default is 60 s: 53 s there, the same points)


def problem_named(name: str):
    """A bundled problem, or gen64-sK: a generated 64-GPU priced cluster (seed K) with Llama-2 13B."""
    if name.startswith("gen64-s"):
        cluster = priced(generate_cluster(64, MIX, int(name.removeprefix("gen64-s"))))
        return generated_problem(cluster, "llama2-13b", name=f"gen-64-s{name.removeprefix('gen64-s')}-llama2-13b")
    return load_problem(name)


def level_row(problem, budget: float, heuristic_s: float, exact_s: float) -> dict:
    """One budget level: the heuristic's plan and CP-SAT's, both within the budget."""
    at = at_budget(problem, budget)
    heur = get("heuristic")(at, SolverOptions(time_limit_s=heuristic_s))
    exact = get("cpsat")(at, SolverOptions(time_limit_s=exact_s))
    t_h = iteration_time(problem, heur.plan) if heur.plan is not None else None
    t_e = iteration_time(problem, exact.plan) if exact.plan is not None else None
    return judged({"problem": problem.name, "budget": budget, "heuristic_s": t_h,
                   "sets": len(maximal_sets(problem, budget)),
                   "heuristic_rent": rent_per_hour(problem, heur.plan) if heur.plan is not None else None,
                   "exact_s": t_e, "exact_status": exact.status.value, "bound_s": exact.bound_s})


def judged(row: dict) -> dict:
    """The row with the heuristic's T read against CP-SAT's and the best bound: its excess over
    CP-SAT's T, its gap to the bound, and whether it is within 3 % of the proven optimum (or of
    the bound where no optimum is proven)."""
    t_h, t_e, bound = row["heuristic_s"], row["exact_s"], row["bound_s"]
    reference = t_e if row["exact_status"] == "optimal" else bound
    return row | {"vs_exact": None if t_h is None or t_e is None else t_h / t_e - 1,
                  "gap": None if t_h is None or not bound else (t_h - bound) / t_h,
                  "within": None if t_h is None or reference is None else t_h <= reference * (1 + WITHIN)}


def with_heuristic(problem, row: dict, heuristic_s: float) -> dict:
    """A reused row with the heuristic's column solved again (after a change to the heuristic);
    CP-SAT's columns stay the last run's, and are marked so in the table."""
    at = at_budget(problem, row["budget"])
    heur = get("heuristic")(at, SolverOptions(time_limit_s=heuristic_s))
    t_h = iteration_time(problem, heur.plan) if heur.plan is not None else None
    return judged(row | {"heuristic_s": t_h, "heuristic_rent": rent_per_hour(problem, heur.plan) if heur.plan else None,
                         "heuristic_before_s": row.get("heuristic_before_s", row["heuristic_s"]), "exact_stale": True})


def with_configuration_bound(problem, row: dict, limit_s: float) -> dict:
    """The row with the configuration bound at its budget (docs/bounds.md [U6]/[P5] on the whole
    menu and [P8] by maximal machine sets, `--bound-s`, the heuristic's T as the first
    threshold) beside CP-SAT's: `bound_s` becomes the larger, and the gap and "within 3 %" are
    read against it."""
    at = at_budget(problem, row["budget"])
    start = time.perf_counter()
    config = budget_bound(at, row["heuristic_s"], start + limit_s, exact=cpsat_set_bound)
    if config.value < row.get("config_bound_s", 0.0):
        return row  # a bound holds whatever code proved it: a redo that proves less keeps the row
    cpsat = row.get("cpsat_bound_s", row["bound_s"])
    bound = max(b for b in (cpsat, config.value) if b is not None)
    return judged(row | {"cpsat_bound_s": cpsat, "config_bound_s": config.value, "config_complete": config.complete,
                         "whole_bound_s": config.whole.value, "sets_bound_s": config.by_sets,
                         "bounded_sets": len(config.sets), "config_s": time.perf_counter() - start,
                         "config_limit_s": limit_s, "bound_s": bound})


def cpsat_set_bound(restricted, seconds: float) -> float | None:
    """CP-SAT's proven bound on a maximal set's restricted problem (docs/bounds.md [P8]: any valid
    bound of a set will do), None on sets above EXACT_SET_DEVICES, where it proves little."""
    if restricted.cluster.num_devices > EXACT_SET_DEVICES:
        return None
    return get("cpsat")(restricted, SolverOptions(time_limit_s=seconds)).bound_s


def best_over_all_sets(problem, budget: float, per_set_s: float) -> float | None:
    """The heuristic on every maximal affordable machine set (up to MAX_SETS of them; None beyond):
    the least T an exhaustive choice of machines would give the same heuristic."""
    sets = maximal_sets(problem, budget)
    if len(sets) > MAX_SETS:
        return None
    found = [r.objective_s for _, r in (solve_on_set(solve_heuristic, problem, SolverOptions(time_limit_s=per_set_s),
                                                   machines, per_set_s) for machines in sets) if r.plan is not None]
    return min(found, default=None)


def large_frontier_seconds(levels: int = 10, limit_s: float = 60.0) -> dict:
    """`hexiscale frontier` on a generated 1,024-GPU priced problem: the whole command, timed."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "gen1024.yaml"
        write_problem(generated_problem(priced(generate_cluster(1024, MIX, 0))), path)
        command = [str(Path(sys.executable).parent / "hexiscale"), "frontier", str(path), "--levels", str(levels),
                   "-t", str(limit_s), "--json"]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
    rows = json.loads(done.stdout) if done.returncode == 0 else []
    return {"wall_s": wall, "limit_s": limit_s, "levels": levels, "points": len(rows), "returncode": done.returncode,
            "rows": [{k: r[k] for k in ("rent_per_hour", "iteration_s", "cost_per_mtok")} for r in rows]}


def _f(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _was(row: dict) -> str:
    before = row.get("heuristic_before_s")
    if before is None or row["heuristic_s"] is None or f"{before:.4g}" == f"{row['heuristic_s']:.4g}":
        return ""
    return f" (was {before:.4g})"


def table_rows(rows: list[dict]) -> list[list[str]]:
    return [[r["problem"], f"{r['budget']:.2f}", _f(r["heuristic_s"], ".4g") + _was(r), _f(r["heuristic_rent"], ".2f"),
             _f(r["exact_s"], ".4g") + (" *" if r.get("exact_stale") else ""), r["exact_status"], _f(r.get("cpsat_bound_s"), ".4g"),
             _f(r.get("whole_bound_s"), ".4g"),
             _f(r.get("sets_bound_s"), ".4g") + (f" ({r['bounded_sets']})" if r.get("bounded_sets") else ""),
             _f(r.get("config_bound_s"), ".4g") + ("" if r.get("config_complete", True) else " (open)"),
             _f(r["bound_s"], ".4g"), _f(r["vs_exact"], "+.2%"),
             _f(r["gap"], ".2%"), {True: "yes", False: "no", None: "—"}[r["within"]], str(r.get("sets", "—")),
             _f(r.get("all_sets_s"), ".4g"),
             _f(None if r.get("all_sets_s") is None or r["heuristic_s"] is None
                else r["heuristic_s"] / r["all_sets_s"] - 1, "+.2%")] for r in rows]


def report(rows: list[dict], large: dict | None, offers: dict, args) -> str:
    """benchmarks/report/frontier.md's text."""
    lines = ["# The time–rent frontier: heuristic against the exact solver", "",
             f"`benchmarks/bench_frontier.py --levels {args.levels} --heuristic-s {args.heuristic_s:g} "
             f"--exact-s {args.exact_s:g} --bound-s {args.bound_s:g}` on 2 shared cores (docs/frontier.md). Per "
             "budget level: the heuristic under the budget, then CP-SAT under it (rented_M and the budget in the "
             "model, warm-started from the heuristic's plan), then the configuration bound under it (docs/bounds.md "
             "[U6] where the usage tables fit: whole machines rented per class within the budget; else the LP route "
             "with the budget as a row of its master and D in ranges, [P5]–[P7]) and, where the maximal "
             "affordable machine sets can be listed, the least of their own bounds without a budget ([P8]: half "
             "the time, shared over the sets; every plan within the budget lies in one of them; what the sets leave of "
             f"that half goes to CP-SAT on the set that holds the least bound, where it has ≤ {EXACT_SET_DEVICES} "
             "devices: the larger of its two bounds counts); *config. "
             "bound*: the larger of the two ('open': its side did not examine every D in its time). "
             "*bound s*: the larger of the two bounds. *within 3 %*: the heuristic's T within 3 % of the proven "
             "optimum, or of the best proven bound where no optimum is proven."
             + (" \\* CP-SAT's columns and the every-set columns are the run's before the heuristic's last change "
                "(`--redo-heuristic`: the heuristic solved again, 'was' its T then; CP-SAT had been warm-started "
                "from that plan)." if any(r.get("exact_stale") for r in rows) else ""), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    longer = [f"{r['problem']} at {r['budget']:.2f}/h ({r['config_limit_s']:g} s)" for r in rows
              if r.get("config_limit_s", args.bound_s) != args.bound_s]
    if longer:
        lines += ["", "The configuration bound had another time limit than `--bound-s` at (`--redo-bound "
                      "--redo-levels` with another `--bound-s`): " + "; ".join(longer) + "."]
    lines += ["", "## The offers problem's frontier", "",
              f"`hexiscale frontier offers-llama2-13b -t {OFFERS_LIMIT_S:g}` (heuristic, 10 budget levels, "
              f"{offers['wall_s']:.0f} s):", "",
              "| rent/h | T s | cost per Mtok | rents |", "|---:|---:|---:|---|"]
    lines += [f"| {p['rent_per_hour']:.2f} | {p['iteration_s']:.4g} | {p['cost_per_mtok']:.4g} | {p['rents']} |"
              for p in offers["points"]]
    points = offers["points"]
    if points:
        cheap = min(points, key=lambda p: (p["cost_per_mtok"], p["iteration_s"]))
        lines += ["", f"Cheapest per token: {cheap['rents']} at {cheap['rent_per_hour']:.2f}/h "
                      f"({cheap['cost_per_mtok']:.4g} per Mtok, T {cheap['iteration_s']:.4g} s); fastest: "
                      f"{points[-1]['rents']} at {points[-1]['rent_per_hour']:.2f}/h "
                      f"(T {points[-1]['iteration_s']:.4g} s)."]
    lines += ["", "![offers frontier](pictures/offers-frontier.png)"]
    if large is not None:
        lines += ["", f"1,024-GPU priced cluster (generated, seed 0, {MIX}, Llama-2 70B): `hexiscale frontier "
                      f"--levels {large['levels']} -t {large['limit_s']:g}` took {large['wall_s']:.1f} s in all "
                      f"(exit {large['returncode']}), {large['points']} points on the frontier."]
    return "\n".join(lines) + "\n"


def level_rows(args, console, cached: dict) -> list[dict]:
    """Part 1's rows: each problem's budget levels, from the cache (`--reuse`) where present; the
    every-set column added where missing."""
    rows = []
    for name in args.problems.split(","):
        problem = problem_named(name)
        for budget in budget_levels(problem, args.levels):
            console.print(f"[dim]{problem.name} at {budget:.2f}/h …[/]")
            row = cached.get((problem.name, round(budget, 6))) or level_row(problem, budget, args.heuristic_s,
                                                                             args.exact_s)
            redo = not args.redo_levels or f"{budget:.2f}" in args.redo_levels.split(",")
            if args.redo_heuristic and redo and row is cached.get((problem.name, round(budget, 6))):
                row = with_heuristic(problem, row, args.heuristic_s)
            if ("config_bound_s" not in row or args.redo_bound and redo) and row["heuristic_s"] is not None:
                row = with_configuration_bound(problem, row, args.bound_s)
            if "all_sets_s" not in row:
                row["sets"] = len(maximal_sets(problem, budget))
                row["all_sets_s"] = best_over_all_sets(problem, budget, args.per_set_s)
            rows.append(row)
    return rows


def offers_frontier(time_limit_s: float, pictures: Path) -> dict:
    """`hexiscale frontier offers-llama2-13b`'s heuristic frontier (10 levels), its picture, and
    its points."""
    from hexiscale.cli.frontier import rented_gpus
    from hexiscale.viz.frontier import draw_frontier

    problem = load_problem("offers-llama2-13b")
    front = frontier(problem, get("heuristic"), exact=False, time_limit_s=time_limit_s)
    labels = [rented_gpus(problem, p.plan) for p in front.points]
    draw_frontier(problem, front, labels, pictures, "offers")
    return {"wall_s": front.wall_s, "points": [{"rent_per_hour": p.rent_per_hour, "iteration_s": p.iteration_s,
                                                "cost_per_mtok": p.cost_per_mtok, "rents": label}
                                               for p, label in zip(front.points, labels)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="offers-llama2-13b,gen64-s0,gen64-s1,gen64-s3",
                        help="gen64-sK: a generated 64-GPU priced cluster (seeds 0 and 1 came out nearly alike)")
    parser.add_argument("--levels", type=int, default=6)
    parser.add_argument("--heuristic-s", type=float, default=20.0)
    parser.add_argument("--exact-s", type=float, default=60.0)
    parser.add_argument("--bound-s", type=float, default=120.0, help="the configuration bound's time per level")
    parser.add_argument("--per-set-s", type=float, default=5.0, help="the heuristic's time on each maximal set")
    parser.add_argument("--skip-large", action="store_true", help="leave out the 1,024-GPU command")
    parser.add_argument("--reuse", action="store_true", help="keep the rows (and the 1,024-GPU timing) of the "
                                                             "last run's JSON; compute only what is missing")
    parser.add_argument("--redo-bound", action="store_true", help="recompute the configuration bound column "
                                                                  "of reused rows (after a change to the bound)")
    parser.add_argument("--redo-heuristic", action="store_true", help="solve the heuristic column of reused rows "
                        "again (after a change to the heuristic; CP-SAT's and the every-set columns stay)")
    parser.add_argument("--redo-levels", default="", help="with --redo-bound / --redo-heuristic: only the levels of "
                        "these budgets (as the table prints them, e.g. 48.03,24.99)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/report/frontier.md")
    args = parser.parse_args()
    console = Console()
    last = json.loads(args.out.with_suffix(".json").read_text()) if args.reuse else {}
    cached = {(r["problem"], round(r["budget"], 6)): r for r in last.get("levels", [])}
    rows = level_rows(args, console, cached)
    large = last.get("large") if args.reuse and last.get("large") else (None if args.skip_large
                                                                        else large_frontier_seconds())
    offers = last.get("offers") if args.reuse and last.get("offers") and not args.redo_heuristic else offers_frontier(
        OFFERS_LIMIT_S, args.out.parent / "pictures")
    table = Table(title="heuristic vs exact per budget level")
    for col in COLUMNS:
        table.add_column(col)
    for cells in table_rows(rows):
        table.add_row(*cells)
    console.print(table)
    args.out.write_text(report(rows, large, offers, args))
    args.out.with_suffix(".json").write_text(json.dumps({"levels": rows, "large": large, "offers": offers},
                                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
