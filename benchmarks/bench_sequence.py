"""Sequence plans (docs/sequence-plans.md §7, after HexiSeq): the heuristic against the
homogeneous baselines, against the brute-force optimum on tiny problems, and the scheduler's
speed.

1. Quality (and cross-machine traffic against `seq-roundrobin`): heuristic vs `seq-uniform`
   (Megatron CP / USP / Ulysses run by hand: equal shards, heads and batches, one HP degree,
   the best over the device sets a user would try, so slow GPU types may idle, as in the
   layered `symmetric`), vs `seq-uniform-all` (the old reference: the same on the whole
   cluster, where the slowest type sets the pace of an equal shard) and vs `seq-roundrobin`
   on the bundled simulated suites (32, 64, 128 GPUs, up to 4 GPU types) and the H100 + A100
   testbed. HexiSeq reports 1.11–1.36× on average and 1.72× at best over homogeneous baselines.
2. Optimality: heuristic vs `brute` on seeded tiny problems (tests/test_sequence_solvers.py's
   generators); targets worst ≤ 3 %, mean ≤ 1 %, no false infeasible.
3. Speed: the heuristic's wall time at 128 GPUs (target ≤ 0.5 s, HexiSeq's figure) and 1024
   GPUs (≤ 5 s, a generated cluster of the same four types).

    .venv/bin/python benchmarks/bench_sequence.py [--tiny 40] [--repeat 3]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from instances.generate import generate_cluster, generated_problem  # noqa: E402
from planner.hardware import Cluster, Machine  # noqa: E402
from planner.io import load_problem  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.sequence import cost  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.sequence import baselines, brute, heuristic  # noqa: E402
from test_sequence_solvers import hetero_seq, tiny_seq  # noqa: E402

SUITES = ["longctx-sim-32-llama3-8b-128k", "longctx-sim-64-llama3-8b-128k", "longctx-sim-128-llama3-8b-128k",
          "longctx-sim-128-llama-30b-512k", "longctx-h100-a100-llama3-8b-64k", "longctx-h100-a100-llama-30b-256k"]
MIX = "H100:0.25,A100-80G:0.25,L40S:0.25,V100:0.25"
COMPARED = (("heuristic", heuristic.solve), ("seq-uniform", baselines.solve_uniform),
             ("seq-uniform-all", baselines.solve_uniform_all), ("seq-roundrobin", baselines.solve_roundrobin))
console = Console(width=180)


def _t(res) -> str:
    return f"{res.objective_s:.3f}" if res.objective_s is not None else res.status.value


def suite_rows(names: list[str] | None = None) -> list[dict]:
    """Per suite: T of the heuristic and of the three baselines (None: no plan), each plan's
    cross-machine HP + CP traffic per iteration in GB and its layout. The report's data
    (run_all.py)."""
    rows = []
    for name in names or SUITES:
        problem = load_problem(name)
        results = {k: fn(problem) for k, fn in COMPARED}
        row = {"problem": name, "gpus": problem.cluster.num_devices, "seq_len": problem.training.seq_len}
        for k, res in results.items():
            row[k] = res.objective_s
            row[f"{k} GB"] = cross_machine_bytes(problem, res.plan) / 1e9 if res.plan is not None else None
            row[f"{k} layout"] = layout_text(problem, res.plan)
        rows.append(row)
    return rows


def layout_text(problem: Problem, plan) -> str:
    """A plan's shape and devices, e.g. "n1 D4 G4 on 16/32 (H100)": group size n and ring
    length G (a range "n1-4" where they differ), D replicas ("—": no plan)."""
    if plan is None:
        return "—"
    cluster = problem.cluster
    devices = [m.device for r in plan.replicas for g in r.ring for m in g.members]
    types = dict.fromkeys(cluster.gpu_of(int(cluster.machine_of_device[d])).name for d in devices)
    sizes = [len(g.members) for r in plan.replicas for g in r.ring]
    rings = [len(r.ring) for r in plan.replicas]
    span = lambda xs: f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}-{max(xs)}"  # noqa: E731
    return (f"n{span(sizes)} D{len(plan.replicas)} G{span(rings)} on {len(devices)}/{cluster.num_devices} "
            f"({', '.join(types)})")


def _x(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _over(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def speedups(rows: list[dict], baseline: str = "seq-uniform") -> list[float]:
    """T_baseline / T_heuristic per row where both have a plan (rows saved before
    seq-uniform-all existed have no such key)."""
    return [r[baseline] / r["heuristic"] for r in rows if r["heuristic"] and r.get(baseline)]


def quality_table(rows: list[dict]) -> Table:
    table = Table(title="heuristic vs homogeneous baselines (T in s; speed-up = T_baseline / T_heuristic)")
    for col in ("problem", "GPUs", "heuristic", "seq-uniform", "speed-up", "seq-uniform layout",
                "seq-uniform-all (old)", "speed-up", "seq-roundrobin", "speed-up"):
        table.add_column(col, justify="left" if col in ("problem", "seq-uniform layout") else "right")
    for r in rows:
        table.add_row(r["problem"], str(r["gpus"]), _x(r["heuristic"]), _x(r["seq-uniform"]),
                      _over(r["seq-uniform"], r["heuristic"]), r["seq-uniform layout"],
                      _x(r["seq-uniform-all"]), _over(r["seq-uniform-all"], r["heuristic"]),
                      _x(r["seq-roundrobin"]), _over(r["seq-roundrobin"], r["heuristic"]))
    captions = [f"vs {k}: mean {statistics.mean(ups):.2f}×, best {max(ups):.2f}×, worst {min(ups):.2f}×"
                for k in ("seq-uniform", "seq-uniform-all") if (ups := speedups(rows, k))]
    if captions:
        table.caption = "; ".join(captions) + " (HexiSeq: 1.11–1.36× mean, 1.72× best)"
    return table


def cross_machine_bytes(problem, plan) -> float:
    """HP all-to-all and CP ring bytes per iteration that cross machines (ZeRO and DP traffic
    left out: both plans gather and sync the same states): §7.2's exchanges split by
    destination — qkv i→j b·t_i·(h+2kd)·β·heads_j/a, outputs i→j b·t_j·heads_i·d·β, ×r_a2a —
    and each member's ring receipt b·(s−T_g)·2·kv_i·d·β ×ρ when its machine is not in the
    previous group; × L × m_r."""
    model, tr, machine = problem.model, problem.training, problem.cluster.machine_of_device
    b, beta, d, a = tr.micro_batch, tr.act_bytes, model.head_dim, model.heads
    width, r_a2a, rho = model.hidden + 2 * model.num_kv_heads * d, cost.a2a_rounds(tr), cost.ring_rounds(tr)
    total = 0.0
    for rep in plan.replicas:
        per_layer = 0.0
        for g, group in enumerate(rep.ring):
            members = group.members
            for i in members:
                for j in members:
                    if machine[i.device] != machine[j.device]:
                        per_layer += r_a2a * b * beta * (i.tokens * width * j.heads / a + j.tokens * i.heads * d)
            prev = {int(machine[m.device]) for m in rep.ring[g - 1].members}
            if len(rep.ring) > 1:
                per_layer += sum(rho * b * (tr.seq_len - group.tokens) * 2 * (m.heads * model.num_kv_heads / a) * d * beta
                                 for m in members if int(machine[m.device]) not in prev)
        total += per_layer * model.layers * rep.batch // b
    return total


def traffic_table(rows: list[dict]) -> Table:
    table = Table(title="cross-machine HP + CP traffic per iteration (GB): heuristic vs seq-roundrobin")
    for col in ("problem", "heuristic", "seq-uniform", "seq-uniform-all", "seq-roundrobin", "heuristic / roundrobin"):
        table.add_column(col, justify="right" if col != "problem" else "left")
    for r in rows:
        gb = [r[f"{k} GB"] for k in ("heuristic", "seq-uniform", "seq-uniform-all", "seq-roundrobin")]
        table.add_row(r["problem"], *("—" if x is None else f"{x:.1f}" for x in gb),
                      f"{gb[0] / gb[3]:.2f}" if gb[0] is not None and gb[3] else "—")
    table.caption = "HexiSeq: about 30 % less cross-machine traffic than round-robin placement"
    return table


def optimality_table(count: int) -> Table:
    gaps, infeasible, misses, rows = [], 0, 0, []
    for i in range(count):
        problem = tiny_seq(i // 2) if i % 2 == 0 else hetero_seq(i // 2)
        exact, heur = brute.solve(problem), heuristic.solve(problem, SolverOptions(seed=i))
        if exact.objective_s is None:
            infeasible += 1
            misses += heur.plan is not None  # a plan where brute proved none would be a bug
            continue
        if heur.objective_s is None:
            misses += 1
            continue
        gaps.append(heur.objective_s / exact.objective_s - 1)
        rows.append((problem.name, exact.wall_s, heur.wall_s))
    table = Table(title=f"heuristic vs brute force on {count} tiny problems")
    for col in ("feasible", "infeasible (agreed)", "missed", "worst gap", "mean gap", "brute s (mean)", "heuristic s (mean)"):
        table.add_column(col, justify="right")
    table.add_row(str(len(gaps)), str(infeasible), str(misses), f"{max(gaps, default=0):.3%}",
                  f"{statistics.mean(gaps) if gaps else 0:.4%}", f"{statistics.mean(r[1] for r in rows):.2f}",
                  f"{statistics.mean(r[2] for r in rows):.2f}")
    table.caption = "targets: worst ≤ 3 %, mean ≤ 1 %, no false infeasible"
    return table


FLOP_MATCHED = ["longctx-h100-a100-llama3-8b-64k", "longctx-h100-a100-llama-30b-256k"]


def homogeneous_twin(problem: Problem, gpu: str = "H100") -> Problem:
    """The problem on machines of one GPU type with (as nearly as whole GPUs allow) the same
    total peak FLOP/s: HexiSeq's FLOP-matched homogeneous comparison. Machines of 8 as in
    the original, the first machine's intra and the cluster's inter bandwidth everywhere."""
    cluster = problem.cluster
    peak = cluster.catalog[gpu].peak_tflops * 1e12
    count = max(1, round(cluster.total_peak_flops / peak))
    first = cluster.machines[0]
    machines = [Machine(name=f"{gpu.lower()}-{i}", gpu=gpu, count=min(8, count - 8 * i),
                        intra_bw_gbps=first.intra_bw_gbps) for i in range((count + 7) // 8)]
    twin = Cluster(name=f"{cluster.name}-homogeneous-{gpu}", machines=tuple(machines),
                   inter_bw_gbps=cluster.inter_bw_gbps, inter_latency_us=cluster.inter_latency_us,
                   intra_latency_us=cluster.intra_latency_us, gpu_types=cluster.gpu_types)
    return Problem(name=f"{problem.name}-homogeneous", cluster=twin, model=problem.model, training=problem.training)


def flop_matched_rows(names: list[str] | None = None) -> list[dict]:
    """Per problem: the heuristic's T on the heterogeneous cluster and on its FLOP-matched
    homogeneous twin; `ratio` = T_hetero / T_homo scaled by the two clusters' peak FLOP/s
    (1.0: the mixed cluster is used as well as the uniform one; HexiSeq: within 3 %)."""
    rows = []
    for name in names or FLOP_MATCHED:
        problem = load_problem(name)
        twin = homogeneous_twin(problem)
        hetero, homo = heuristic.solve(problem), heuristic.solve(twin)
        flops = problem.cluster.total_peak_flops / twin.cluster.total_peak_flops
        ratio = (hetero.objective_s * flops / homo.objective_s
                 if hetero.objective_s is not None and homo.objective_s is not None else None)
        rows.append({"problem": name, "gpus": problem.cluster.num_devices, "twin_gpus": twin.cluster.num_devices,
                     "flops_ratio": flops, "hetero_s": hetero.objective_s, "homo_s": homo.objective_s,
                     "ratio": ratio})
    return rows


def flop_matched_table(rows: list[dict]) -> Table:
    table = Table(title="FLOP-matched homogeneous twin (heuristic on both; ratio = T_het·F_het/F_hom / T_hom)")
    for col in ("problem", "GPUs", "twin H100s", "F_het/F_hom", "T het s", "T hom s", "ratio"):
        table.add_column(col, justify="right" if col != "problem" else "left")
    for r in rows:
        table.add_row(r["problem"], str(r["gpus"]), str(r["twin_gpus"]), f"{r['flops_ratio']:.3f}",
                      _x(r["hetero_s"]), _x(r["homo_s"]), _x(r["ratio"]))
    return table


def speed_table(repeat: int) -> Table:
    table = Table(title="scheduler speed (heuristic wall time, best of repeats)")
    for col in ("problem", "GPUs", "machines", "wall s", "target s", "T s"):
        table.add_column(col, justify="right" if col != "problem" else "left")
    big = generated_problem(generate_cluster(1024, MIX, seed=1), "llama3-8b", seq_len=131072, global_batch=64,
                            name="gen-1024-llama3-8b-128k")
    for problem, target in ((load_problem("longctx-sim-128-llama3-8b-128k"), 0.5), (big, 5.0)):
        runs = [heuristic.solve(problem) for _ in range(repeat)]
        wall = min(r.wall_s for r in runs)
        table.add_row(problem.name, str(problem.cluster.num_devices), str(len(problem.cluster.machines)),
                      f"{wall:.2f}", f"{target:g}", _t(runs[0]))
    return table


def main(tiny: int = typer.Option(40, help="tiny problems against brute force"),
         repeat: int = typer.Option(3, help="timing repeats")) -> None:
    start = time.perf_counter()
    rows = suite_rows()
    console.print(quality_table(rows))
    console.print(traffic_table(rows))
    console.print(flop_matched_table(flop_matched_rows()))
    console.print(optimality_table(tiny))
    console.print(speed_table(repeat))
    console.print(f"bench_sequence: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    typer.run(main)
