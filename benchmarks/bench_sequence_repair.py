"""The sequence re-plan's repair on seeded random problems (docs/checkpoints.md §10): how often
the repaired old plan fits in memory, and its T against a fresh solve of the survivors.

Per seed: a problem of tests/test_sequence_solvers.py's generators (`tiny_seq`: random_small's
clusters, memory from well under one replica's states; `hetero_seq`: 3–5 devices of distinct
speed, memory set by states and activations) or of `mixed_seq` here (8–16 GPUs of four types,
80 to 24 GB, Llama-3 8B at 32K–128K tokens), the heuristic's plan as the old plan, 1 or 2 of
its devices lost (seeded). Counted: repairs offered (something survived), repairs that fit in
memory (the plan validates), the polished repair as a candidate (`best_repair`), fresh solves
with a plan, and T of the fitting repair over the fresh solve's. `--baseline REV` runs the
repair of `solvers/sequence/replan.py` at git revision REV on the same cases, side by side.

    .venv/bin/python benchmarks/bench_sequence_repair.py [--seeds 60] [--families tiny,hetero,mixed] [--baseline HEAD]
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from instances.generate import generate_cluster, generated_problem  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.sequence import iteration_time, validate  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.replan import survivors  # noqa: E402
from solvers.sequence import heuristic  # noqa: E402
from solvers.sequence import replan as current  # noqa: E402
from test_sequence_solvers import hetero_seq, tiny_seq  # noqa: E402

MIX = "H100:0.25,A100-80G:0.25,L40S:0.25,RTX4090:0.25"


def mixed_seq(seed: int) -> Problem:
    """8–16 GPUs of four types (80, 80, 48 and 24 GB), Llama-3 8B at 32K–128K tokens, q = 64."""
    rng = random.Random(f"mixed-seq/{seed}")
    cluster = generate_cluster(rng.choice([8, 12, 16]), MIX, seed=seed)
    problem = generated_problem(cluster, "llama3-8b", seq_len=rng.choice([32768, 65536, 131072]),
                                global_batch=rng.choice([2, 4, 8]), name=f"mixed-seq-{seed}")
    return problem.model_copy(update={"training": problem.training.model_copy(update={"token_block": 64})})


GENERATORS = {"tiny": tiny_seq, "hetero": hetero_seq, "mixed": mixed_seq}
SOLVE = SolverOptions(time_limit_s=2.0)
POLISH_S = 1.0


def module_at(rev: str) -> types.ModuleType:
    """solvers/sequence/replan.py as it was at git revision `rev` (a module of its own; what it
    imports is today's, whose plain `deal` deals as it did)."""
    text = subprocess.run(["git", "show", f"{rev}:solvers/sequence/replan.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    module = types.ModuleType(f"replan_at_{rev}")
    exec(compile(text, f"replan@{rev}", "exec"), module.__dict__)
    return module


def cases(seeds: int, families: list[str]):
    """(family, seed, problem, old plan, lost devices) of every seed whose heuristic finds a plan."""
    for family in families:
        make = GENERATORS[family]
        for seed in range(seeds):
            problem = make(seed)
            plan = heuristic.solve(problem, SOLVE).plan
            if plan is None or problem.cluster.num_devices < 2:
                continue
            rng = random.Random(f"repair/{family}/{seed}")
            used = sorted(plan.devices)
            count = min(rng.choice([1, 2]), problem.cluster.num_devices - 1, len(used))
            yield family, seed, problem, plan, set(rng.sample(used, count))


def judge(module, problem, plan, new, mapping) -> dict:
    """The raw repair (offered, fits, T, the repair's reason when None) and the polished candidate's T."""
    start = time.perf_counter()
    try:
        (repaired, changes), why = module.repair(problem, plan, new, mapping), ""
    except ValueError as error:  # NoRoom: no memory-feasible repair (the old repair never says so)
        (repaired, changes), why = (None, []), str(error)
    repair_s = time.perf_counter() - start
    fits = repaired is not None and not validate(new, repaired)
    fit = module.RunFit.of(problem)
    best_s = module.best_repair(problem, plan, new, mapping, fit, time.perf_counter() + POLISH_S)[1]
    return {"offered": repaired is not None, "fits": fits, "T": iteration_time(new, repaired) if fits else None,
            "best": best_s, "repair_s": repair_s, "why": why, "how": how(changes)}


def how(changes: list[str]) -> str:
    """How the repair fitted: a replica dropped for memory, the sequence dealt again, or the deal."""
    if any("dropped (no memory" in c for c in changes):
        return "a replica dropped"
    return "dealt again" if any("dealt again" in c for c in changes) else "deal"


def measure(seeds: int, families: list[str], modules: dict) -> list[dict]:
    rows = []
    for family, seed, problem, plan, lost in cases(seeds, families):
        new, mapping = survivors(problem, lost)
        fresh = heuristic.solve(new, SOLVE)
        row = {"family": family, "case": f"{family}-{seed}", "lost": len(lost), "fresh": fresh.objective_s}
        for name, module in modules.items():
            row[name] = judge(module, problem, plan, new, mapping)
        rows.append(row)
    return rows


def ratios(rows: list[dict], name: str, key: str) -> list[float]:
    return [r[name][key] / r["fresh"] for r in rows if r[name][key] is not None and r["fresh"]]


def report(rows: list[dict], name: str, title: str) -> None:
    n = len(rows)
    offered = sum(r[name]["offered"] for r in rows)
    fits = sum(r[name]["fits"] for r in rows)
    best = sum(r[name]["best"] is not None for r in rows)
    print(f"{title}, {name}: {n} cases; repair offered {offered}, fits in memory {fits} ({fits / n:.0%}); "
          f"polished repair a candidate {best}; fresh solve has a plan {sum(r['fresh'] is not None for r in rows)}")
    for key, what in (("T", "fitting repair"), ("best", "polished repair")):
        x = ratios(rows, name, key)
        if x:
            print(f"  {what} T / fresh T over {len(x)} cases: median {statistics.median(x):.3f}, "
                  f"mean {statistics.mean(x):.3f}, min {min(x):.3f}, max {max(x):.3f}, "
                  f"≤ fresh in {sum(v <= 1 + 1e-9 for v in x)}")
    print(f"  repair wall time: max {max(r[name]['repair_s'] for r in rows) * 1e3:.1f} ms")


def main(seeds: int = typer.Option(60, help="seeds per generator"),
         families: str = typer.Option("tiny,hetero,mixed", help="generators, comma-separated"),
         baseline: str = typer.Option("", help="git revision whose repair runs beside the current one")) -> None:
    modules = {"now": current} | ({f"at {baseline}": module_at(baseline)} if baseline else {})
    names = families.split(",")
    rows = measure(seeds, names, modules)
    for family in names + (["all"] if len(names) > 1 else []):
        chosen = [r for r in rows if family in ("all", r["family"])]
        for name in modules:
            report(chosen, name, family)
    if baseline:
        gained = [r["case"] for r in rows if r["now"]["fits"] and not r[f"at {baseline}"]["fits"]]
        lost = [r["case"] for r in rows if not r["now"]["fits"] and r[f"at {baseline}"]["fits"]]
        print(f"fits now, not at {baseline}: {len(gained)} {gained[:12]}; fitted at {baseline}, not now: {lost}")
        rescued = [r for r in rows if r["now"]["fits"] and not r[f"at {baseline}"]["fits"]]
        for way in sorted({r["now"]["how"] for r in rescued}):
            x = [r["now"]["T"] / r["fresh"] for r in rescued if r["now"]["how"] == way and r["fresh"]]
            print(f"  by {way}: {len(x)}, T / fresh T median {statistics.median(x):.3f}, max {max(x):.3f}")


if __name__ == "__main__":
    typer.run(main)
