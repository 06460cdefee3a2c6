"""What ZeRO-1 and sequence parallelism buy where memory binds (issue 31's "Plans" table).

    .venv/bin/python benchmarks/bench_memory_bound.py [--time-limit 10] [--problems a,b] [--generated 64,128]

On 24 GB RTX 3090/4090 cards a 70B-class model's states at μ = 16 bytes per parameter force
deep pipelines: each stage holds few layers and the bubble grows. ZeRO-1 across pipelines
(docs/checkpoints.md §11) keeps μ − μ_o + μ_o/D per parameter instead, sequence parallelism
(docs/cost-model.md §3.5) divides a TP stage's activations by t. For each memory-bound
setting — the bundled heterogeneous settings with RTX 3090/4090 cards or 70B models, and
generated clusters of 24 GB cards (`hexiscale generate problem --mix RTX4090:0.5,RTX3090:0.5
--model llama2-70b`) — each solver (default: the heuristic, and the symmetric Megatron-style
grid search, whose layouts share one (dp, pp, tp) so that memory decides which dp it may use)
solves the problem four times (neither, ZeRO-1, SP, both; the same short time limit each) and
the table shows each plan's T, its shape and its smallest memory headroom. Prints a markdown
table (for the report) and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances.generate import generate_cluster, generated_problem  # noqa: E402
from planner.io import load_model, load_problem  # noqa: E402
from planner.layered.evaluate import evaluate  # noqa: E402
from planner.problem import Problem  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.registry import solve  # noqa: E402

# bundled settings with RTX 3090/4090 cards (hetero-1..3, case study) or a 70B model (H800 + H20)
BUNDLED = ["hetero1-llama2-13b", "hetero2-llama2-13b", "hetero3-llama-30b", "case-study-llama2-13b",
           "h800-h20-16-16-llama2-70b", "h800-h20-16-24-llama2-70b"]
VARIANTS = {"neither": {}, "ZeRO-1": {"zero_stage": 1}, "SP": {"sequence_parallel": True},
            "both": {"zero_stage": 1, "sequence_parallel": True}}
RTX_MIX = "RTX4090:0.5,RTX3090:0.5"


def settings(args) -> list[Problem]:
    """The bundled problems, hetero-3's cluster with Llama-2 70B, and generated 24 GB clusters."""
    problems = [load_problem(name) for name in args.problems.split(",") if name]
    hetero3 = load_problem("hetero3-llama-30b")
    problems.append(hetero3.model_copy(update={"name": "hetero3-llama2-70b", "model": load_model("llama2-70b")}))
    for gpus in (int(g) for g in args.generated.split(",") if g):
        cluster = generate_cluster(gpus, RTX_MIX, 0)
        problems.append(generated_problem(cluster, "llama2-70b", name=f"gen-{gpus}-rtx-llama2-70b"))
    return problems


def shape(plan) -> str:
    """D pipelines, stages per pipeline and the TP sizes used."""
    stages = sorted({len(p.stages) for p in plan.pipelines})
    tps = sorted({s.tp for p in plan.pipelines for s in p.stages})
    span = f"{stages[0]}" if len(stages) == 1 else f"{stages[0]}-{stages[-1]}"
    return f"D={len(plan.pipelines)}, S={span}, TP {'/'.join(map(str, tps))}, {len(plan.devices)} GPUs"


def solve_variant(problem: Problem, solver: str, variant: dict, time_limit: float) -> dict:
    training = problem.training.model_copy(update=variant)
    priced = problem.model_copy(update={"training": training})
    start = time.perf_counter()
    result = solve(priced, solver, SolverOptions(time_limit_s=time_limit, seed=0))
    row = {"status": str(result.status.value if hasattr(result.status, "value") else result.status),
           "wall_s": time.perf_counter() - start, "T_s": None, "shape": "-", "headroom_gib": None}
    if result.plan is not None:
        estimate = evaluate(priced, result.plan)
        row.update(T_s=estimate.iteration_s, shape=shape(result.plan), headroom_gib=estimate.min_headroom_gib,
                   tokens_per_s=estimate.tokens_per_s)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=10.0, help="each solve's time limit (s)")
    parser.add_argument("--problems", default=",".join(BUNDLED))
    parser.add_argument("--generated", default="64,128", help="sizes of generated RTX 3090/4090 clusters")
    parser.add_argument("--solvers", default="heuristic,symmetric")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "report" / "memory_bound.json")
    args = parser.parse_args()
    rows = []
    print("| setting | solver | variant | T (s) | vs neither | plan | min headroom (GiB) | solve (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for problem in settings(args):
        for solver in args.solvers.split(","):
            rows += solver_rows(problem, solver, args.time_limit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


def solver_rows(problem: Problem, solver: str, time_limit: float) -> list[dict]:
    """One solver's four variants on one setting, each printed as it comes."""
    rows, base = [], None
    for name, variant in VARIANTS.items():
        row = {"problem": problem.name, "solver": solver, "variant": name,
               **solve_variant(problem, solver, variant, time_limit)}
        base = row["T_s"] if name == "neither" else base
        ratio = f"{row['T_s'] / base:.3f}" if row["T_s"] and base else "-"
        t = f"{row['T_s']:.2f}" if row["T_s"] else row["status"]
        headroom = f"{row['headroom_gib']:.1f}" if row["headroom_gib"] is not None else "-"
        print(f"| {problem.name} | {solver} | {name} | {t} | {ratio} | {row['shape']} | {headroom} "
              f"| {row['wall_s']:.1f} |", flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
