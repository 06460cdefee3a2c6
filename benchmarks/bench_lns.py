"""Is there a layered plan better than the default heuristic's? (issue 33)

A search the heuristic does not do, around its plan, every candidate priced by the evaluator
(`planner.layered.pricing.breakdown`, the objective of docs/cost-model.md §3):

- a plan is D pipelines of stages (machine, t, n); devices of one machine are interchangeable,
  so concrete ids follow (`devices_in_order`), and the micro-batches are always re-split over
  the pipelines optimally (greedy min–max on each pipeline's fill-and-drain and period);
- simulated annealing over moves on one pipeline or on every pipeline of the same stage
  pattern at once (a layer between two stages; a device into or out of a TP group; a stage
  split in two or two merged; two stages swapped; a stage moved to another pipeline; a pipeline
  dropped, its devices idle), restarted from the best plan found;
- a large-neighbourhood step: one or two pipelines' devices freed and their pipelines rebuilt
  from scratch by a randomized constructor, then annealed again.

    python benchmarks/bench_lns.py [problem ...] [--seconds 300] [--save DIR]

(a problem: a bundled one by name, or bench_bounds' generated gen-G-sS-llama2-13b)

Prints a table: problem, heuristic T, best T found, gain, time, and what changed.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lns_aligned import enumerate_aligned  # noqa: E402
from lns_moves import Space, describe, from_plan, lns  # noqa: E402
from planner.io import load_problem  # noqa: E402
from planner.layered.plan import Plan  # noqa: E402

PROBLEMS = ["hetero1-llama2-7b", "hetero1-llama2-13b", "hetero2-llama2-7b", "hetero2-llama2-13b",
            "hetero3-llama-30b"]

# -- the bench ----------------------------------------------------------------------------


KINDS = [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (1, 1), (2, 1), (3, 1), (1, 2), (4, 1), (2, 2)]


def heuristic_plan(problem, path, seconds):
    """The default heuristic's plan (`hexiscale solve --kind layered` at its 60 s), read back if saved."""
    if path.exists():
        return Plan.model_validate_json(path.read_text())
    from solvers.common import SolverOptions
    from solvers.layered.composed import solve_heuristic
    plan = solve_heuristic(problem, SolverOptions(time_limit_s=seconds)).plan
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.to_json())
    return plan


def named_problem(name):
    """A bundled problem by name, or one of bench_bounds' generated ones (gen-G-sS-llama2-13b)."""
    generated = re.fullmatch(r"gen-(\d+)-s(\d+)-llama2-13b", name)
    if generated:
        from bench_bounds import generated as generated_problem
        return generated_problem(int(generated[1]), int(generated[2]))
    return load_problem(ROOT / "instances" / "problems" / f"{name}.yaml")


def search(name, seconds, save, heuristic_seconds, seed=0, log=print):
    """Heuristic plan, the aligned enumeration, then annealing and rebuilds from the best plans."""
    problem = named_problem(name)
    space = Space(problem)
    start_plan = heuristic_plan(problem, save / f"{name}.heuristic.json", heuristic_seconds)
    start = from_plan(space, start_plan)
    t_heur, _ = space.price(start)
    began = time.time()
    found = enumerate_aligned(space, KINDS, t_heur, deadline=began + seconds / 2)
    log(f"{name}: heuristic {t_heur:.4f} s; aligned enumeration {time.time() - began:.0f} s, "
        f"best {found[0][0] if found else math.inf:.4f} s ({found[0][3] if found else '-'})")
    starts = [(t_heur, start, None, "heuristic")] + distinct(found, 3)
    rng = random.Random(seed)
    best = min(starts, key=lambda s: s[0])
    share = max(0.0, began + seconds - time.time()) / len(starts)
    for t0, pipes, _, what in starts:
        got = lns(space, pipes, share, rng, log=lambda s: log(f"  from {what[:40]}: {s}"))
        if got[0] < best[0] - 1e-9:
            best = (got[0], got[1], got[2], f"{what} + annealing")
    return problem, space, t_heur, best, time.time() - began


def distinct(found, k):
    out, seen = [], set()
    for f in found:
        key = str(sorted(map(str, f[1])))
        if key not in seen:
            seen.add(key)
            out.append(f)
        if len(out) == k:
            break
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=PROBLEMS)
    parser.add_argument("--seconds", type=float, default=300.0, help="search time per problem")
    parser.add_argument("--heuristic-seconds", type=float, default=60.0)
    parser.add_argument("--save", type=Path, default=ROOT / "benchmarks" / "report" / "lns_plans")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for name in args.problems:
        problem, space, t_heur, best, wall = search(name, args.seconds, args.save, args.heuristic_seconds, args.seed)
        gain = (t_heur - best[0]) / t_heur * 100
        if gain > 1e-6:
            plan = space.plan(best[1], best[2])
            (args.save / f"{name}.lns.json").write_text(plan.to_json())
        rows.append((name, t_heur, best[0], gain, wall, best[3] if gain > 1e-6 else "nothing better",
                     describe(best[1])))
    print("\n| problem | heuristic T s | best T s | gain % | search s | found by |\n|---|---:|---:|---:|---:|---|")
    for name, th, tb, gain, wall, what, _ in rows:
        print(f"| {name} | {th:.4f} | {tb:.4f} | {gain:.3f} | {wall:.0f} | {what} |")
    for name, *_, pipes in rows:
        print(f"\n{name}, best plan (machine:t x layers per stage):")
        for line in pipes:
            print("  " + line)


if __name__ == "__main__":
    main()
