"""Proven gaps on the paper settings and on generated clusters (issue 33): per problem, the
default heuristic's plan, the configuration bound (docs/bounds.md) over every D, the gap and
the time the bound took. The bound is proven, so the heuristic's gap to the optimum is at
most the gap shown.

    .venv/bin/python benchmarks/bench_bounds.py [--heuristic-limit 20] [--bound-limit 60]
        [--problems a,b] [--generated 24,40,64] [--seeds 5] [--seed-from 0] [--big 128] [--big-seeds 1] [--fresh]

Results are cached in benchmarks/bounds_cache.json by (problem, limits); the table goes to
benchmarks/report/bounds.md. The generated clusters mix A100-80G, RTX4090 and H20 (Llama-2 13B).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compare import HETERO, HOMO, load_bench_problem  # noqa: E402
from instances.generate import generate_cluster, generated_problem  # noqa: E402
from planner.problem import Problem  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from planner.layered.pricing import iteration_time  # noqa: E402
from solvers.layered.bound.plans import plans_from_bound  # noqa: E402
from solvers.layered.bound.search import configuration_bound  # noqa: E402
from solvers.layered.heuristic import HeuristicOptions, solve_with as own_search  # noqa: E402
from solvers.layered.tables import Tables  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / "bounds_cache.json"
REPORT = ROOT / "benchmarks/report/bounds.md"
MIX = "A100-80G:1,RTX4090:1,H20:1"
CACHE_VERSION = "bare-tables"  # rows measured before the bare tables (docs/bounds.md [U5]) are not reused
BOUND_VERSION = "U17"  # rows whose bound was measured before the last change to it are marked in the report
PLAN_LIMIT_S = 30.0  # reading plans back from the bound's tables (and their structure moves)
DEFAULT_LIMIT_S = 60.0  # `hexiscale solve --kind layered`'s default time limit


def generated(gpus: int, seed: int) -> Problem:
    cluster = generate_cluster(gpus, MIX, seed)
    return generated_problem(cluster, "llama2-13b", name=f"gen-{gpus}-s{seed}-llama2-13b")


def measure(problem: Problem, heuristic_limit: float, bound_limit: float, verbose: bool = False) -> dict:
    """The heuristic's plan (threads 1) and the configuration bound from it, with their times
    (`verbose`: the bound's log on stderr, seconds since it started)."""
    start = time.perf_counter()
    own = own_search(problem, SolverOptions(time_limit_s=heuristic_limit, threads=1), HeuristicOptions())
    heuristic_s = time.perf_counter() - start
    tables = Tables(problem)
    d_values = list(range(1, tables.max_pipelines + 1))
    started = time.perf_counter()
    log = (lambda line: print(f"{time.perf_counter() - started:7.1f} s  {problem.name}: {line}", file=sys.stderr,
                              flush=True)) if verbose else (lambda line: None)
    bound = configuration_bound(tables, own.objective_s, d_values, started + bound_limit, log=log,
                                first_d=len(own.plan.pipelines) if own.plan else None)
    bound_s = time.perf_counter() - started
    read = plans_from_bound(problem, bound, time.perf_counter() + PLAN_LIMIT_S)
    tables_best = (iteration_time(problem, read[0]), len(read[0].pipelines)) if read else None
    return {"problem": problem.name, "gpus": problem.cluster.num_devices, "bound": bound.value,
            "trivial": tables.trivial_bound, "complete": bound.complete, "heuristic_s": heuristic_s,
            "bound_s": bound_s, "heuristic_limit_s": heuristic_limit, "bound_limit_s": bound_limit,
            "bound_version": BOUND_VERSION, **plan_fields(own, bound.value, tables_best)}


def plan_fields(own, bound: float, tables_best: tuple[float, int] | None) -> dict:
    """The heuristic's T and D, the best plan's (the plan read back from the tables, `tables_best`
    = (T, D), where strictly faster), and both gaps to `bound`."""
    t = own.objective_s
    d = len(own.plan.pipelines) if own.plan else None
    best, best_d = tables_best if tables_best is not None and t is not None and tables_best[0] < t else (t, d)
    return {"T": t, "pipelines": d, "gap": (t - bound) / t if t else None, "best": best, "best_pipelines": best_d,
            "best_gap": (best - bound) / best if best else None, "from_tables": best != t,
            "best_from": "tables" if best != t else "heuristic"}


def with_heuristic(row: dict, problem: Problem, heuristic_limit: float) -> dict:
    """A cached row with the heuristic solved again (after a change to the heuristic); the bound
    and the plans read back from its tables stay (a bound holds whatever the incumbent was)."""
    start = time.perf_counter()
    own = own_search(problem, SolverOptions(time_limit_s=heuristic_limit, threads=1), HeuristicOptions())
    tables_best = (row["best"], row["best_pipelines"]) if row["from_tables"] else None
    row = {k: v for k, v in row.items() if k != "default_limit_s"}  # the default run is compared again
    return row | plan_fields(own, row["bound"], tables_best) | {
        "heuristic_s": time.perf_counter() - start, "T_before": row.get("T_before", row["T"])}


def with_default(row: dict, problem: Problem, limit: float) -> dict:
    """A cached row with the heuristic's plan at `limit` (the CLI's default) beside the bench's
    shorter run: its T, D and gap to the same bound, and the best plan the faster of all."""
    start = time.perf_counter()
    own = own_search(problem, SolverOptions(time_limit_s=limit, threads=1), HeuristicOptions())
    t = own.objective_s
    out = row | {"T_default": t, "default_pipelines": len(own.plan.pipelines) if own.plan else None,
                 "default_gap": (t - row["bound"]) / t if t else None, "default_s": time.perf_counter() - start,
                 "default_limit_s": limit}
    if t is not None and t < row["best"]:
        out |= {"best": t, "best_pipelines": out["default_pipelines"], "best_gap": out["default_gap"],
                "from_tables": False, "best_from": "default"}
    return out


def store(key: str, row: dict) -> dict:
    """One row into the cache on disk, keeping the rows another run may have added meanwhile;
    the cache as written."""
    cache = (json.loads(CACHE.read_text()) if CACHE.exists() else {}) | {key: row}
    CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return cache


def rows_for(problems: list[tuple[str, callable]], args) -> list[dict]:
    cache = json.loads(CACHE.read_text()) if CACHE.exists() and not args.fresh else {}
    rows = []
    for name, make in problems:
        key = f"{CACHE_VERSION}/{name}/{args.heuristic_limit:g}/{args.bound_limit:g}"
        # `store` hands back the whole cache on disk; only this key's row is taken from it, so that
        # under --fresh the next problems are measured again rather than read back
        if key not in cache:
            cache[key] = store(key, measure(make(), args.heuristic_limit, args.bound_limit, args.verbose))[key]
        elif args.redo_heuristic:
            cache[key] = store(key, with_heuristic(cache[key], make(), args.heuristic_limit))[key]
        if args.default_limit and cache[key].get("default_limit_s") != args.default_limit:
            cache[key] = store(key, with_default(cache[key], make(), args.default_limit))[key]
        row = cache[key]
        print(f"{name}: T {row['T']:.5g} s, best {row.get('best', row['T']):.5g} s, bound {row['bound']:.5g} s, "
              f"gap {row['gap']:.2%}, {row['bound_s']:.0f} s", flush=True)
        rows.append(row)
    return rows


def _mark(row: dict) -> str:
    """' † (U9)' on a row whose bound an earlier version measured, '' on the current one's."""
    version = row.get("bound_version")
    return "" if version == BOUND_VERSION else f" † ({version or 'before U9'})"


def markdown(rows: list[dict], args) -> str:
    lines = ["# Proven gaps (configuration bound, issue 33)", "",
             f"Heuristic: the default heuristic's own search, {args.heuristic_limit:g} s, 1 thread. Bound: "
             f"`solvers/layered/bound` (docs/bounds.md) over every D, at most {args.bound_limit:g} s per problem, "
             "one process on the shared 2-core machine. The gap is (T − bound)/T: the heuristic's plan is "
             "within it of the optimum. 'open' = the time limit stopped the bound before every D was examined "
             "(those D contribute the trivial bound)."
             + (" 'was': the heuristic's T before its last change (solved again with `--redo-heuristic`; the "
                "bound and the plans read back stay)." if any("T_before" in r for r in rows) else ""), "",
             (f"Default heuristic: the same search at {args.default_limit:g} s, the plan of `hexiscale solve "
              "--kind layered` at its default time limit, against the same bound (plain `hexiscale solve` gives the "
              "layered search the same limit less the sequence heuristic's seconds, 0.4 s on a 64-GPU cluster: "
              "solvers/choose.py)." if args.default_limit
              else "Default heuristic: not solved in this run (`--default-limit 0`)."), "",
             "Best plan: the fastest of the two heuristics' and the plans read back from the bound's tables "
             f"(docs/bounds.md §8, at most {PLAN_LIMIT_S:g} s); its gap is (best − bound)/best.", "",
             "Route: the usage tables and their integer test where they fit the time (classes of like machines, "
             "else by GPU: the 64-GPU rows); otherwise the LP certificate over ranges of D (docs/bounds.md §4a: "
             "the 128-GPU rows, whose usage tables would take hours; no plans are read back there).", "",
             f"| problem | GPUs | heuristic T s | D | default ({args.default_limit:g} s) T s | D | best T s | D "
             "| proven bound s | trivial bound s | heuristic gap | default gap | best gap | bound time s | complete |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        was = f" (was {r['T_before']:.4f})" if abs(r.get("T_before", r["T"]) - r["T"]) > 1e-9 * r["T"] else ""
        default = (f"{r['T_default']:.4f} | {r['default_pipelines']}" if r.get("T_default") else "— | —")
        default_gap = f"{r['default_gap']:.2%}" if r.get("T_default") else "—"
        lines.append(f"| {r['problem']} | {r['gpus']} | {r['T']:.4f}{was} | {r['pipelines']} | {default} | {r['best']:.4f}"
                     f"{' (tables)' if r['from_tables'] else ' (default)' if r.get('best_from') == 'default' else ''} | {r['best_pipelines']} | {r['bound']:.4f} | "
                     f"{r['trivial']:.4f} | {r['gap']:.2%} | {default_gap} | {r['best_gap']:.2%} | {r['bound_s']:.0f} | "
                     f"{'yes' if r['complete'] else 'open'}{_mark(r)} |")
    if any(r.get("bound_version") != BOUND_VERSION for r in rows):
        lines += ["", f"† bound measured by an earlier version of the bound (in brackets, its last label in docs/bounds.md; "
                      f"now {BOUND_VERSION}: [U10] the room on the machines every pipeline uses, [U11] the split on T_dp's "
                      "level in the time left once every D is examined, [U12] layers aligned across the pipelines below "
                      "a level of T_dp, [U13] per interval of T_dp, the caps of its top and the lift of its floor at once, "
                      "[U14] cases on the narrowest holder's width, [U15] local layers of a shared class at most the "
                      "fewest any pipeline holds there, [U16] cases on the fewest stages of any pipeline, every stage's "
                      "sync floor shared out over them, [U17] a one-stage pipeline's layers that cannot stay on its "
                      "machine). "
                      "Each version refutes every threshold the one before it did, so given the time "
                      "to finish, these bounds are at least what the table shows. None of [U10]–[U17] changes the LP "
                      "route (the 128-GPU rows)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heuristic-limit", type=float, default=20.0)
    parser.add_argument("--redo-heuristic", action="store_true",
                        help="solve the heuristic of cached rows again (after a change to it); their bounds stay")
    parser.add_argument("--bound-limit", type=float, default=60.0)
    parser.add_argument("--default-limit", type=float, default=DEFAULT_LIMIT_S,
                        help="also solve the heuristic at this limit (the CLI's default; 0: not)")
    parser.add_argument("--problems", default=",".join(HETERO + HOMO))
    parser.add_argument("--generated", default="24,40,64", help="generated cluster sizes ('' for none)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seed-from", type=int, default=0, help="the first seed (to split a run over processes)")
    parser.add_argument("--big", default="128", help="generated sizes with --big-seeds seeds ('' for none)")
    parser.add_argument("--big-seeds", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="ignore the cache")
    parser.add_argument("--verbose", action="store_true", help="the bound's progress on stderr")
    args = parser.parse_args(argv)
    problems = [(n, lambda n=n: load_bench_problem(n)) for n in args.problems.split(",") if n]
    sizes = [int(g) for g in args.generated.split(",") if g]
    problems += [(f"gen-{g}-s{s}-llama2-13b", lambda g=g, s=s: generated(g, s)) for g in sizes
                 for s in range(args.seed_from, args.seed_from + args.seeds)]
    big = [int(g) for g in args.big.split(",") if g]
    problems += [(f"gen-{g}-s{s}-llama2-13b", lambda g=g, s=s: generated(g, s)) for g in big for s in range(args.big_seeds)]
    rows = rows_for(problems, args)
    REPORT.write_text(markdown(rows, args))
    print(f"report: {REPORT}")
    return rows


if __name__ == "__main__":
    main()
