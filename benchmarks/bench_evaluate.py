"""How fast is the one evaluator? Plans over 64 … 4096 GPUs (generated clusters, llama2-70b,
many pipelines, mixed TP sizes), mean wall time of `evaluate`, `iteration_time` (with and
without the structural check) and `validate`.

Target (docs/cost-model.md §3.6, the heuristic's inner loop): ≤ 5 ms per evaluation at 1024 GPUs.

    .venv/bin/python benchmarks/bench_evaluate.py [--sizes 64,256,1024,4096] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances.generate import generate_cluster, generated_problem  # noqa: E402
from planner import Plan, Problem, evaluate, validate  # noqa: E402
from planner.layered.pricing import iteration_time  # noqa: E402

MIX = "A100-80G:0.25,H800:0.25,RTX4090:0.25,H20:0.25"
TARGET_MS_AT_1024 = 5.0
# how a machine is cut into TP groups (mixed sizes on purpose); 70B allows t ∈ {1, 2, 4, 8}
SPLITS = {8: ([8], [4, 4], [4, 2, 2], [2, 2, 2, 2]), 4: ([4], [2, 2], [2, 1, 1])}


def tp_groups(cluster, rng: np.random.Generator) -> list[list[int]]:
    groups = []
    for m in range(len(cluster.machines)):
        devices = cluster.devices_of(m)
        options = SPLITS[len(devices)]
        split = options[rng.integers(len(options))]
        for t in split:
            groups.append(devices[:t])
            devices = devices[t:]
    return groups


def benchmark_case(gpus: int, seed: int = 0, stages_per_pipeline: int = 8) -> tuple[Problem, Plan]:
    """A plan with ~gpus/(8·avg t) pipelines of 8 stages, uneven layers and batches."""
    rng = np.random.default_rng(seed)
    cluster = generate_cluster(gpus, MIX, seed)
    groups = tp_groups(cluster, rng)
    pipelines = max(1, len(groups) // stages_per_pipeline)
    model_layers = 80
    spec = []
    for p in range(pipelines):
        stage_groups = groups[p::pipelines]
        cuts = np.sort(rng.choice(np.arange(1, model_layers), len(stage_groups) - 1, replace=False))
        layers = np.diff(np.concatenate([[0], cuts, [model_layers]])).tolist()
        spec.append({"batch": int(rng.integers(4, 17)),
                     "stages": [{"devices": g, "layers": n} for g, n in zip(stage_groups, layers)]})
    batch = sum(p["batch"] for p in spec)
    problem = generated_problem(cluster, "llama2-70b", global_batch=batch)
    return problem, Plan.model_validate({"pipelines": spec})


def call_times(fn, budget_s: float) -> np.ndarray:
    """Wall time of each of repeated calls filling about budget_s (at least 5 calls)."""
    fn()  # warm caches (cluster matrices, imports)
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return np.array(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024,4096")
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget per measurement")
    args = parser.parse_args()
    table = Table(title="evaluator speed, ms per call: mean (best); llama2-70b", header_style="bold")
    for col in ("GPUs", "machines", "pipelines", "stages", "evaluate", "iteration_time",
                "… check=False", "validate", "T (s)"):
        table.add_column(col, justify="right")
    console = Console()
    for gpus in (int(x) for x in args.sizes.split(",")):
        problem, plan = benchmark_case(gpus)
        times = [call_times(f, args.seconds) * 1e3 for f in (
            lambda: evaluate(problem, plan), lambda: iteration_time(problem, plan),
            lambda: iteration_time(problem, plan, check=False), lambda: validate(problem, plan))]
        missed = gpus == 1024 and times[0].mean() > TARGET_MS_AT_1024
        cells = [f"{t.mean():.2f} ({t.min():.2f})" for t in times]
        table.add_row(str(gpus), str(len(problem.cluster.machines)), str(len(plan.pipelines)),
                      str(plan.num_stages), ("[red]" if missed else "") + cells[0], *cells[1:],
                      f"{iteration_time(problem, plan):.3g}")
    console.print(table)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    console.print(f"target: evaluate ≤ {TARGET_MS_AT_1024} ms at 1024 GPUs "
                  f"(load average now {load:.1f} on {os.cpu_count()} cores: means suffer on a busy machine)")


if __name__ == "__main__":
    main()
