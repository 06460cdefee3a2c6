"""Proven gaps of sequence plans on the bundled 32-GPU long-context suite (issue 33,
docs/sequence_bounds.md): per problem, the `bound` solver's best plan, its proven lower bound,
the gap, the time it took, and the default heuristic's T and proven gap; where the heuristic
is more than 1 % above the bound, how the best plan's replicas differ from the heuristic's.
Writes benchmarks/report/sequence_bounds.md and sequence_bounds.json.

    .venv/bin/python benchmarks/bench_sequence_bounds.py [--time-limit 600] [--problems a,b]

The suite is every bundled long-context problem on 32 GPUs: the simulated 32-GPU cluster
(HexiSeq's simulated scale, 2 GPU types), the H100 + A100 testbed at five sequence lengths
for two models, and the H100 + MI300X mixed-vendor cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.io import load_problem  # noqa: E402
from planner.problem import Problem  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers import registry  # noqa: E402
from solvers.sequence import heuristic  # noqa: E402
from solvers.sequence.bound import solver  # noqa: E402

SUITE = ["longctx-sim-32-llama3-8b-128k"] + [
    f"longctx-h100-a100-{model}-{length}" for model in ("llama3-8b", "llama-30b")
    for length in ("64k", "128k", "256k", "512k", "1m")] + ["longctx-h100-mi300x-llama3-8b-128k"]
QUICK = ["longctx-sim-32-llama3-8b-128k"]
REPORT = ROOT / "benchmarks" / "report"
REPORT_NAME = "sequence_bounds"  # .md and .json under REPORT
HEURISTIC_LIMIT_S = 60.0  # the default heuristic as users run it (`solve`'s default limit)
THREADS = 2


def replicas_text(problem: Problem, plan) -> str:
    """The plan's replicas grouped alike: devices per GPU type, machines spanned, HP sizes,
    micro-batches; e.g. "2× [7 H100 on 1 machine, HP 1, m=3]"."""
    cluster, b = problem.cluster, problem.training.micro_batch
    shapes = []
    for r in plan.replicas:
        devices = [m.device for g in r.ring for m in g.members]
        machines = {int(cluster.machine_of_device[d]) for d in devices}
        types = Counter(cluster.gpu_of(int(cluster.machine_of_device[d])).name for d in devices)
        hp = sorted({len(g.members) for g in r.ring})
        kinds = " + ".join(f"{n} {t}" for t, n in types.most_common())
        shapes.append(f"{kinds} on {len(machines)} machine{'s' * (len(machines) > 1)}, "
                      f"HP {'/'.join(map(str, hp))}, m={r.batch // b}")
    return "; ".join(f"{n}× [{s}]" for s, n in Counter(shapes).items())


def run_one(name: str, time_limit: float) -> dict:
    problem = load_problem(name)
    start = time.perf_counter()
    heur = registry.solve(problem, "heuristic", SolverOptions(time_limit_s=HEURISTIC_LIMIT_S, threads=THREADS),
                          kind="sequence")
    heuristic_s = time.perf_counter() - start
    own = heuristic.solve(problem, SolverOptions(time_limit_s=HEURISTIC_LIMIT_S, threads=THREADS))
    start = time.perf_counter()
    res = solver.solve(problem, SolverOptions(time_limit_s=time_limit, threads=THREADS))
    wall = time.perf_counter() - start
    bound = res.bound_s
    row = {"problem": name, "gpus": problem.cluster.num_devices, "seq_len": problem.training.seq_len,
           "best_s": res.objective_s, "bound_s": bound, "gap": res.gap, "status": res.status.value,
           "prove_s": wall, "heuristic_s": heur.objective_s, "heuristic_wall_s": heuristic_s,
           "heuristic_gap": _gap(heur.objective_s, bound), "own_s": own.objective_s,
           "own_gap": _gap(own.objective_s, bound),
           "best_plan": replicas_text(problem, res.plan), "heuristic_plan": replicas_text(problem, heur.plan),
           "own_plan": replicas_text(problem, own.plan),
           "message": res.message}
    print(f"{name}: T {res.objective_s:.4f} bound {bound:.4f} gap {100 * res.gap:.2f}% in {wall:.1f} s; "
          f"heuristic {heur.objective_s:.4f} (gap {100 * row['heuristic_gap']:.2f}%)", flush=True)
    return row


def _gap(t: float | None, bound: float | None) -> float | None:
    return None if bound is None or t is None else max(0.0, (t - bound) / t)


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.2f} %"


def markdown(rows: list[dict], context: dict) -> str:
    lines = ["# Proven gaps of sequence plans: the 32-GPU long-context suite", "",
             "Made by `benchmarks/bench_sequence_bounds.py` (`make bench`); the bound and the solver are "
             "docs/sequence_bounds.md. T in seconds per iteration (the planner's, docs/sequence-plans.md §7.2); "
             "gap = (T − bound)/T; the heuristic's gap is against the same proven bound. *heuristic*: the "
             "registry's (`solve --kind sequence`: its own search, then the configuration rounds where the "
             "device sets can be listed, solvers/sequence/composed.py); *own search*: HexiSeq's two-stage "
             "heuristic alone, as it was before.", "",
             f"Limits used: {context['limits']}. Machine: {context['machine']}. Run {context['date']}, "
             f"{context['wall_s']:.0f} s in all, commit {context['commit'] or '?'}.", "",
             "| problem | s | best T | proven bound | gap | status | time to prove | heuristic T | heuristic s "
             "| heuristic gap | own search T | own search gap |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['problem']} | {r['seq_len']} | {r['best_s']:.4f} | {r['bound_s']:.4f} | {_pct(r['gap'])} | "
                     f"{r['status']} | {r['prove_s']:.1f} s | {r['heuristic_s']:.4f} | {r['heuristic_wall_s']:.1f} | "
                     f"{_pct(r['heuristic_gap'])} | {r['own_s']:.4f} | {_pct(r['own_gap'])} |")
    worst = max((r["gap"] for r in rows), default=0.0)
    lines += ["", f"Largest proven gap: {_pct(worst)} (target ≤ 2 % within 10 minutes); slowest proof "
              f"{max((r['prove_s'] for r in rows), default=0.0):.1f} s.", "",
              "## Where the own search is more than 1 % from the bound", ""]
    far = [r for r in rows if r["own_gap"] is not None and r["own_gap"] > 0.01]
    for r in far:
        lines += [f"- **{r['problem']}** (own search {_pct(r['own_gap'])}, heuristic {_pct(r['heuristic_gap'])}): "
                  f"own search {r['own_plan']}; heuristic {r['heuristic_plan']}; best {r['best_plan']}."]
    if not far:
        lines.append("None.")
    lines += ["", context.get("analysis", ""), ""]
    return "\n".join(lines)


def _git_head() -> str:
    try:
        import subprocess
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10)
        return out.stdout.strip()
    except OSError:
        return ""


ANALYSIS = (
    "Two patterns set the heuristic apart from the best plans. (1) One-type replicas with an uneven "
    "micro-batch split: e.g. 3 micro-batches on each H100 replica and 1 on each A100 replica, the A100 "
    "replica setting T. Equal mixed replicas (every D-th group of the whole cluster) split the "
    "micro-batches evenly. Fixed in this issue: the heuristic's coarse stage also deals the whole "
    "cluster 'striped' (solvers/sequence/coarse.py); before that its proven gaps were 2.45 % "
    "(h100-a100 llama3-8b 128k), 4.10 % (256k), 1.47 % (512k) and 1.86 % (llama-30b 256k). "
    "(2) Uneven mixed replicas: on longctx-sim-32 the best plan runs two replicas of 7 H100 with 3 "
    "micro-batches each and two of 1 H100 + 6 A100 with 1 each, where the heuristic runs two 8-H100 "
    "replicas and leaves all 16 A100 idle; on h100-a100 llama-30b 128k, replicas of 7 H100 + 3 A100 "
    "beside one of 10 A100 + 2 H100. No deal of whole groups builds these; the configuration rounds do "
    "(they pick the replicas' device sets, the heuristic builds each one's ring). Fixed: the registry's "
    "sequence heuristic runs those rounds from its own plan with the time its search leaves, on clusters "
    "whose device sets per machine can be listed (solvers/sequence/composed.py): seconds of its 60 s limit "
    "on 32 GPUs.")


def run(names: list[str], time_limit: float, out: Path = REPORT) -> list[dict]:
    """Every problem's row; writes the report and its JSON under `out`."""
    start, load = time.perf_counter(), os.getloadavg()[0]
    rows = [run_one(n, time_limit) for n in names]
    context = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": f"{platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} CPU cores "
                          f"shared with other work (load {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)",
               "limits": f"`bound` time limit {time_limit:g} s per problem ({THREADS} threads), of which "
                         f"{solver.HEURISTIC_SHARE:.0%} for its heuristic start; the heuristic column "
                         f"with its default {HEURISTIC_LIMIT_S:g} s limit",
               "wall_s": time.perf_counter() - start, "commit": _git_head(), "analysis": ANALYSIS}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{REPORT_NAME}.json").write_text(json.dumps({"context": context, "rows": rows}, indent=2) + "\n")
    (out / f"{REPORT_NAME}.md").write_text(markdown(rows, context))
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per problem for `bound`")
    parser.add_argument("--problems", default=",".join(SUITE))
    parser.add_argument("--out", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    return run(args.problems.split(","), args.time_limit, args.out)


if __name__ == "__main__":
    main()
