"""Figures of the benchmark report: speed-ups per setting, scaling, and plan pictures."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

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


def draw_calibration(report: dict, path: Path, stat: str = "mean") -> Path:
    """Predicted against measured step time, after `profile`, after profile with the machine's
    drift taken out (probe-scaled, when the report has it) and after a hold-out `calibrate`:
    one point per run, the ±10 % and ±20 % bands of issue 15 around y = x, marked by cluster
    (A and C one process per core, B two) and plan kind."""
    runs = report["runs"]
    panels = [(key, label) for key, label in (("profile", "after profile"), ("steady", "probe-scaled"),
                                              ("calibrated", "after hold-out calibrate"))
              if key in report["summary"]["all"][stat]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), sharex=True, sharey=True)
    seen = [v * 1e3 for r in runs for v in (r[f"measured_{stat}"], *(r.get(f"{key}_{stat}") for key, _ in panels))
            if v is not None and v == v]
    low, top = 0.8 * min(seen), 1.25 * max(seen)
    line = np.array([low, top])
    colours = {"A": "tab:blue", "C": "tab:green", "B": "tab:red"}
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.0f}" if str(round(v))[0] in "1235" else "")
    for ax, (key, label) in zip(axes, panels):
        for band, alpha in ((0.2, 0.08), (0.1, 0.15)):
            ax.fill_between(line, line * (1 - band), line * (1 + band), color="grey", alpha=alpha, linewidth=0)
        ax.plot(line, line, color="black", linewidth=0.8)
        for r in runs:
            predicted = r.get(f"{key}_{stat}")
            if predicted is None or predicted != predicted:  # a refused fit: no point
                continue
            sequence = r["plan"].startswith("sequence")
            ax.scatter(r[f"measured_{stat}"] * 1e3, predicted * 1e3, s=36, marker="D" if sequence else "o",
                       facecolors="none" if sequence else colours[r["cluster"]], edgecolors=colours[r["cluster"]])
        parts = [f"{subset.split(' (')[0].replace('processes', 'proc.').replace('process', 'proc.')}: "
                 f"mean {got['mean']:.0%}, worst {got['worst']:.0%}"
                 for subset, per in report["summary"].items() if subset != "all"
                 for got in (per[stat][key],)]
        ax.set_title(f"{label}, |error|:\n" + "\n".join(parts), fontsize=9, loc="left")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, top)
        ax.set_ylim(low, top)
        for axis in (ax.xaxis, ax.yaxis):  # milliseconds as plain numbers, not powers of ten
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(plain)
        ax.set_xlabel("measured step (ms)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("predicted T (ms)")
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=c, label=f"cluster {n}") for n, c in colours.items()]
    handles.append(plt.Line2D([], [], marker="D", linestyle="", markerfacecolor="none", color="black",
                              label="sequence plan"))
    axes[-1].legend(handles=handles, fontsize=8, loc="upper left")
    floor = report.get("noise_floor", {}).get(stat, {}).get("difference")
    drift = report.get("profile_drift")
    notes = [f"one plan run twice: {floor:+.0%}" if floor is not None else "",
             "profile drift " + ", ".join(f"{n} {d:.0%}" for n, d in drift.items()) if drift else ""]
    fig.suptitle("Step time on this machine's CPU processes: the cost model's T against the run "
                 f"({stat} of steps; bands ±10 %, ±20 %; A, C: 1 process per core, B: 2)\n"
                 + "; ".join(n for n in notes if n), fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
