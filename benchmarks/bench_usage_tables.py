"""How long one prefix table of the usage DP takes (docs/bounds.md §6), against the route's
estimate (`solvers.layered.bound.route.prefix_seconds`, SECONDS_PER_CELL), on the report's rows.

Per row: the route's classes for D = 2 and 48 breakpoints spread over the table's range, built
twice — sorted, as every caller passes them (the DP skips the breakpoints whose layer limit is
below a layer count), and shuffled (every breakpoint on every step, a mask adding inf: the work
of the DP before the skipping) — the same table both ways. Best of `--repeats` each.

    .venv/bin/python benchmarks/bench_usage_tables.py [--repeats 3] [--out benchmarks/report/usage_tables.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_bounds import generated  # noqa: E402
from bench_compare import load_bench_problem  # noqa: E402
from solvers.layered.bound import route  # noqa: E402
from solvers.layered.bound.classes import class_types  # noqa: E402
from solvers.layered.bound.usage import prefix_table, usage_size  # noqa: E402
from solvers.layered.tables import Tables  # noqa: E402

ROWS = {"gen-24-s2-llama2-13b": lambda: generated(24, 2), "hetero1-llama2-7b": None,
        "hetero2-llama2-7b": None, "gen-40-s2-llama2-13b": lambda: generated(40, 2)}
BREAKPOINTS = 48  # one block of the DP (usage.CHUNK)
D = 2


def best_time(build, repeats: int) -> tuple[float, np.ndarray]:
    times, table = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        table = build()
        times.append(time.perf_counter() - start)
    return min(times), table


def row(name: str, repeats: int) -> list[str]:
    problem = (ROWS[name] or (lambda: load_bench_problem(name)))()
    tables = Tables(problem)
    _, b, _, _, by_gpu = route._route_classes(tables, [D], 1.4 * tables.trivial_bound, np.inf, {D})
    types = class_types(tables, D, by_gpu)
    chosen = b[np.unique(np.linspace(0, len(b) - 1, BREAKPOINTS).astype(int))]
    order = np.random.default_rng(0).permutation(len(chosen))
    sorted_s, table = best_time(lambda: prefix_table(types, chosen), repeats)
    shuffled_s, shuffled = best_time(lambda: prefix_table(types, chosen[order]), repeats)
    assert np.array_equal(shuffled, table[order]), name
    estimate = route.prefix_seconds(tables, types, chosen)
    steps = estimate / route.SECONDS_PER_CELL
    return [name, str(len(chosen)), str(usage_size(types)), str(types.num_types), f"{sorted_s:.3f}",
            f"{shuffled_s:.3f}", f"{1 - sorted_s / shuffled_s:.0%}", f"{estimate:.3f}", f"{sorted_s / steps:.2e}"]


HEADER = ["problem", "breakpoints", "usage cells", "types", "sorted s", "every row s", "saved",
          "estimated s", "s per cell-step"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    lines = [f"| {' | '.join(HEADER)} |", "|" + "---|" * len(HEADER)]
    for name in ROWS:
        lines.append(f"| {' | '.join(row(name, args.repeats))} |")
        print(lines[-1], flush=True)
    text = (f"# One prefix table of the usage DP\n\n`benchmarks/bench_usage_tables.py --repeats {args.repeats}` "
            f"(best of each; D = {D}; the route's estimate at SECONDS_PER_CELL = {route.SECONDS_PER_CELL:g} s). "
            "'every row': the same breakpoints shuffled, so that the DP works on every breakpoint at every "
            "layer count (the work before it skipped those whose layer limit is below the count).\n\n"
            + "\n".join(lines) + "\n")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
