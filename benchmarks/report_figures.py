"""Figures of the benchmark report: speed-ups per setting, scaling, and plan pictures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scaling_report import PAPER_PFLOPS, PAPER_SOLVE_S, ScalingRow  # noqa: E402
from hexiscale.cli.compare import ComparisonRow  # noqa: E402
from hexiscale.viz import draw_plan  # noqa: E402
from bench_compare import load_bench_problem  # noqa: E402
from planner.io import load_plan  # noqa: E402

BAR_SOLVERS = ["heuristic", "cpsat", "milp", "random", "ablation-one-tp", "ablation-equal-batch",
               "symmetric-all", "symmetric"]
# plans worth a picture: the case study both ways, and the heuristic on the largest settings
PICTURED = [("case-study-llama2-13b", "heuristic"), ("case-study-llama2-13b", "symmetric"),
            ("hetero1-llama2-7b", "heuristic"), ("hetero3-llama-30b", "heuristic")]


def draw_speedups(rows: list[ComparisonRow], path: Path) -> Path:
    """Grouped bars: throughput of each solver relative to the symmetric baseline, per problem."""
    problems = list(dict.fromkeys(r.problem for r in rows))
    solvers = [s for s in BAR_SOLVERS if any(r.solver == s and r.speedup for r in rows)]
    width = 0.8 / max(1, len(solvers))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(problems)), 4.8))
    cmap = plt.get_cmap("tab10")
    for i, solver in enumerate(solvers):
        found = [next((r for r in rows if r.problem == p and r.solver == solver), None) for p in problems]
        x = np.arange(len(problems)) + (i - (len(solvers) - 1) / 2) * width
        ax.bar(x, [r.speedup or 0 if r else 0 for r in found], width, label=solver, color=cmap(i))
        for xi, r in zip(x, found):
            if r is not None and r.speedup is None and r.status != "skipped":
                ax.text(xi, 0.02, "×", ha="center", fontsize=7, color=cmap(i))  # ran, no plan
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(problems)), [p.replace("-llama", "\nllama") for p in problems], fontsize=7)
    ax.set_ylabel("throughput / symmetric baseline")
    ax.set_title("Speed-up over the symmetric (Megatron-style) layout, same cost model "
                 "(× at the axis: ran, no valid plan; no bar: not run, e.g. exact solvers on big clusters)", fontsize=9, loc="left")
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_scaling(rows: list[ScalingRow], path: Path) -> Path:
    """Solve time and achieved PFLOP/s against GPUs, ours beside the paper's slide 12."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for solver, marker in (("heuristic", "o"), ("symmetric", "s")):
        mine = [r for r in rows if r.solver == solver]
        if mine:
            left.plot([r.gpus for r in mine], [r.solve_s for r in mine], marker=marker, label=f"{solver} (ours)")
            right.plot([r.gpus for r in mine if r.pflops], [r.pflops for r in mine if r.pflops], marker=marker,
                       label=f"{solver} (ours)")
    left.plot(list(PAPER_SOLVE_S), list(PAPER_SOLVE_S.values()), "k--", marker="^", label="HexiScale paper")
    right.plot(list(PAPER_PFLOPS), list(PAPER_PFLOPS.values()), "k--", marker="^", label="HexiScale paper")
    for ax, label in ((left, "solve wall time (s)"), (right, "achieved model PFLOP/s (cost model)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_yscale("log")
    fig.suptitle("Scaling: generated 4-type clusters, Llama-2 70B (paper: its own clusters and machine)",
                 fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_plan_pictures(rows: list[ComparisonRow], plans_dir: Path, out_dir: Path) -> list[Path]:
    """Cluster graph, Gantt chart and memory bars for the plans in PICTURED that exist."""
    paths = []
    for problem_name, solver in PICTURED:
        plan_path = plans_dir / f"{problem_name}.{solver}.json"
        if not plan_path.is_file():
            continue
        paths += draw_plan(load_bench_problem(problem_name), load_plan(plan_path), out_dir, f"{problem_name}.{solver}.")
    return paths
