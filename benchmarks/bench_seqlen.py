"""Which plan kind wins at which sequence length: on one cluster (longctx-h100-a100, the H100 +
A100 mix of HexiSeq's testbed; its bandwidths are guesses, see the cluster file) and one model
(llama3-8b), s = 4K … 1M tokens at about 1M tokens per iteration (B = 2^20 / s sequences, as
the bundled longctx-*.yaml problems), the best layered plan (docs/plan-space.md §2 and §4, docs/cost-model.md §3: the better of
the layered heuristic and `symmetric`) against the best sequence plan (§7: the better of the
sequence heuristic and `seq-uniform`), every T by the one evaluator of its kind. The problems
are built in code with the planner's types, not read from files.

    .venv/bin/python benchmarks/bench_seqlen.py [--lengths 4096,65536] [--time-limit 60]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.io import load_cluster, load_model  # noqa: E402
from planner.kinds import evaluate  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.workload import TrainingSpec  # noqa: E402
from planner.kinds import kind_of  # noqa: E402
from solvers.choose import solve as solve_auto  # noqa: E402
from solvers.common import SolverOptions  # noqa: E402
from solvers.registry import solve  # noqa: E402

CLUSTER, MODEL = "longctx-h100-a100", "llama3-8b"
LENGTHS = [4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576]
QUICK_LENGTHS = [4096, 65536, 1048576]
TOKENS_PER_ITERATION = 1 << 20
CANDIDATES = {"layered": ("heuristic", "symmetric"), "sequence": ("heuristic", "seq-uniform")}
console = Console(width=150)


class SeqLenRow(BaseModel):
    seq_len: int
    global_batch: int
    layered_s: float | None = None  # best layered T (None: no layered plan fits)
    layered_solver: str = ""
    layered_shape: str = ""
    layered_note: str = ""
    sequence_s: float | None = None
    sequence_solver: str = ""
    sequence_shape: str = ""
    sequence_uniform_s: float | None = None
    auto_kind: str = ""  # what `--kind auto` picks for this problem
    wall_s: float = 0.0

    @property
    def winner(self) -> str:
        if self.layered_s is None and self.sequence_s is None:
            return "none"
        if self.layered_s is None or (self.sequence_s is not None and self.sequence_s < self.layered_s):
            return "sequence"
        return "layered"


def seqlen_problem(seq_len: int) -> Problem:
    """llama3-8b on longctx-h100-a100 at `seq_len`, B = 2^20 / s sequences (at least 1)."""
    training = TrainingSpec(seq_len=seq_len, global_batch=max(1, TOKENS_PER_ITERATION // seq_len),
                            micro_batch=1, recompute=True, token_block=64)
    return Problem(name=f"{CLUSTER}-{MODEL}-{seq_len // 1024}k", cluster=load_cluster(CLUSTER),
                   model=load_model(MODEL), training=training)


def _best(problem: Problem, kind: str, options: SolverOptions):
    """(T, solver, plan, message) of the best of the kind's candidates by the evaluator."""
    best, notes = None, []
    for name in CANDIDATES[kind]:
        result = solve(problem, name, options, kind=kind)
        if result.plan is None:
            notes.append(f"{name}: {result.message or result.status.value}")
            continue
        t = evaluate(problem, result.plan).iteration_s
        if best is None or t < best[0]:
            best = (t, name, result.plan)
    return best, "; ".join(notes)


def _shape(plan) -> str:
    if hasattr(plan, "pipelines"):
        return f"D={len(plan.pipelines)}, " + "/".join(sorted({str(len(p.stages)) for p in plan.pipelines})) + " stages"
    return f"{len(plan.replicas)} rep × " + "/".join(sorted({str(len(r.ring)) for r in plan.replicas})) + " groups, HP " + \
        "/".join(sorted({str(len(g.members)) for r in plan.replicas for g in r.ring}))


def seqlen_row(seq_len: int, options: SolverOptions) -> SeqLenRow:
    start = time.perf_counter()
    problem = seqlen_problem(seq_len)
    auto = solve_auto(problem, "heuristic", options)  # --kind auto: both kinds in one time limit, the faster kept
    row = dict(seq_len=seq_len, global_batch=problem.training.global_batch,
               auto_kind=kind_of(auto.plan).name if auto.plan is not None else "none")
    layered, note = _best(problem, "layered", options)
    if layered is not None:
        row.update(layered_s=layered[0], layered_solver=layered[1], layered_shape=_shape(layered[2]))
    row["layered_note"] = note if layered is None else ""
    sequence, _ = _best(problem, "sequence", options)
    if sequence is not None:
        row.update(sequence_s=sequence[0], sequence_solver=sequence[1], sequence_shape=_shape(sequence[2]))
    uniform = solve(problem, "seq-uniform", options, kind="sequence")
    row["sequence_uniform_s"] = uniform.objective_s
    return SeqLenRow(**row, wall_s=time.perf_counter() - start)


def run(lengths: list[int], time_limit: float = 60.0) -> list[SeqLenRow]:
    options = SolverOptions(time_limit_s=time_limit, progress=False)
    return [seqlen_row(s, options) for s in lengths]


def _k(s: int) -> str:
    return f"{s // 1048576}M" if s >= 1048576 else f"{s // 1024}K"


def _t(x: float | None) -> str:
    return "infeasible" if x is None else f"{x:.3f}"


def seqlen_table(rows: list[SeqLenRow]) -> Table:
    table = Table(title=f"sequence length × best layered plan × best sequence plan ({MODEL} on {CLUSTER}, "
                        f"~{TOKENS_PER_ITERATION / 2**20:.0f}M tokens per iteration; T in s)")
    for col in ("s", "B", "layered T", "layered plan", "sequence T", "sequence plan", "layered / sequence",
                "winner", "--kind auto"):
        table.add_column(col, justify="left" if "plan" in col or col in ("winner", "--kind auto") else "right")
    for r in rows:
        ratio = f"{r.layered_s / r.sequence_s:.2f}×" if r.layered_s and r.sequence_s else "—"
        table.add_row(_k(r.seq_len), str(r.global_batch), _t(r.layered_s),
                      f"{r.layered_solver}: {r.layered_shape}" if r.layered_s else r.layered_note[:60],
                      _t(r.sequence_s), f"{r.sequence_solver}: {r.sequence_shape}" if r.sequence_s else "",
                      ratio, r.winner, r.auto_kind)
    return table


def main(lengths: str = typer.Option(",".join(map(str, LENGTHS)), help="sequence lengths, comma-separated"),
         time_limit: float = typer.Option(60.0, help="seconds per solver run")) -> None:
    start = time.perf_counter()
    rows = run([int(x) for x in lengths.split(",") if x.strip()], time_limit)
    console.print(seqlen_table(rows))
    console.print(f"bench_seqlen: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    typer.run(main)
