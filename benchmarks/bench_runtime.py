"""Runtime throughput: a homogeneous 2-process plan (two pipelines, TP 1, all layers) versus
plain single-process training and torch DDP on the same 2 processes — same model, same
global batch, same data. Target: the runtime within 15% of DDP.

Sequence plans (docs/sequence-plans.md §7): a 2-process ring (2 groups of 1 member, half the sequence
each) against the same runtime on 1 process holding the whole sequence, and each
process's peak memory against its token share (an uneven ring, 1:3, without recompute).

    .venv/bin/python benchmarks/bench_runtime.py [--steps 8] [--hidden 256] [--seq-len 128]
    .venv/bin/python benchmarks/bench_runtime.py --sequence-only [--ring-seq-len 2048]

Tokens/s are medians over the steps after the first two (warm-up). Each process uses one
thread (OMP), so two processes use the machine's two cores; the single-process baseline is
shown with one and with two threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from planner.layered.plan import Pipeline, Plan, Stage  # noqa: E402
from planner.sequence.plan import SeqPlan  # noqa: E402
from planner.workload import ModelSpec  # noqa: E402
from runtime.config import Job, RunConfig  # noqa: E402
from runtime.model.data import BatchLoader, make_source  # noqa: E402
from runtime.launch.launcher import free_port, launch_local  # noqa: E402
from runtime.model.llama import ReferenceLlama  # noqa: E402
from runtime.metrics.runlog import WARMUP_STEPS, after_warmup  # noqa: E402


def make_config(args) -> RunConfig:
    heads = args.hidden // 32
    model = ModelSpec(name="bench", layers=args.layers, hidden=args.hidden, heads=heads, kv_heads=heads,
                      ffn_hidden=8 * args.hidden // 3 // 8 * 8, vocab=256)
    return RunConfig(model=model, seq_len=args.seq_len, micro_batch=args.batch // 2, steps=args.steps,
                     check_replicas=False)


def single_process(config: RunConfig, batch: int, threads: int) -> float:
    torch.set_num_threads(threads)
    model = ReferenceLlama(config.model, config.seq_len, config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=False)
    loader = BatchLoader(make_source(config.data, config.model.vocab, config.seed), config.seq_len)
    rates = []
    for step in range(config.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(*loader.batch(step, 0, batch)).backward()
        optimizer.step()
        rates.append(batch * config.seq_len / (time.perf_counter() - start))
    return statistics.median(rates[WARMUP_STEPS:])


def ddp_worker(rank: int, port: int, config: RunConfig, batch: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    model = torch.nn.parallel.DistributedDataParallel(ReferenceLlama(config.model, config.seq_len, config.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=False)
    loader = BatchLoader(make_source(config.data, config.model.vocab, config.seed), config.seq_len)
    half, rates = batch // 2, []
    for step in range(config.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(*loader.batch(step, rank * half, half)).backward()
        optimizer.step()
        rates.append(batch * config.seq_len / (time.perf_counter() - start))
    if rank == 0:
        results.put(statistics.median(rates[WARMUP_STEPS:]))
    dist.destroy_process_group()


def ddp(config: RunConfig, batch: int) -> float:
    ctx = torch.multiprocessing.get_context("forkserver")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=ddp_worker, args=(r, port, config, batch, results)) for r in range(2)]
    for p in procs:
        p.start()
    rate = results.get(timeout=600)
    for p in procs:
        p.join()
    return rate


def runtime(config: RunConfig, batch: int) -> float:
    plan = Plan(pipelines=[Pipeline(batch=batch // 2, stages=[Stage(devices=[d], layers=config.model.layers)])
                           for d in (0, 1)])
    result = launch_local(Job(plan=plan, config=config), threads=1, echo=False)
    if not result.ok:
        raise SystemExit("runtime run failed:\n" + result.failure_summary())
    return statistics.median(s["tokens_per_s"] for s in result.steps[WARMUP_STEPS:])


def sequence_run(config: RunConfig, batch: int, shares: list[int]) -> tuple[float, list[dict]]:
    """Median tokens/s and the last step's per-member records of a ring of one-member groups
    holding `shares` tokens each (all heads), one process per group."""
    heads = config.model.heads
    plan = SeqPlan.from_rings(problem="", batches=[batch], rings=[[[(d, heads, t)] for d, t in enumerate(shares)]])
    result = launch_local(Job(plan=plan, config=config), threads=1, echo=False)
    if not result.ok:
        raise SystemExit("sequence run failed:\n" + result.failure_summary())
    steps = after_warmup(result.steps)
    return statistics.median(s["tokens_per_s"] for s in steps), result.steps[-1]["members"]


def sequence_tables(args, console: Console) -> None:
    base = make_config(args)
    s = args.ring_seq_len
    config = base.model_copy(update={"seq_len": s, "micro_batch": 1, "recompute": False,
                                     "steps": max(args.sequence_steps, WARMUP_STEPS + 1)})
    one, _ = sequence_run(config, args.ring_batch, [s])
    ring, _ = sequence_run(config, args.ring_batch, [s // 2, s // 2])
    table = Table(title=f"sequence plans: ring vs one process, L={args.layers} h={args.hidden} seq {s} "
                        f"B={args.ring_batch}, median of steps {WARMUP_STEPS + 1}..{config.steps}")
    for column in ("training", "processes", "tokens/s", "vs 1 process"):
        table.add_column(column, justify="right")
    table.add_row("1 group of 1 member (whole sequence)", "1", f"{one:,.0f}", "1.00×")
    table.add_row("ring of 2 groups of 1 (half each)", "2", f"{ring:,.0f}", f"{ring / one:.2f}×")
    console.print(table)
    shares = [s // 4, 3 * s // 4]
    _, members = sequence_run(config.model_copy(update={"steps": 2}), args.ring_batch, shares)
    _, whole = sequence_run(config.model_copy(update={"steps": 2}), args.ring_batch, [s])
    memory = Table(title="peak memory per process vs token share (max RSS above the post-setup RSS; "
                         "no recompute)")
    for column in ("plan", "member", "tokens", "share", "peak MiB", "MiB per 1k tokens"):
        memory.add_column(column, justify="right")
    for label, records in (("ring 1:3", members), ("1 process", whole)):
        for m in records:
            memory.add_row(label, f"g{m['group']}m{m['member']}", str(m["tokens"]), f"{m['tokens'] / s:.2f}",
                           f"{m['peak_mib']:,.0f}", f"{m['peak_mib'] / m['tokens'] * 1e3:,.0f}")
    console.print(memory)
    points = [(m["tokens"], m["peak_mib"]) for m in members + whole]
    slope, intercept = statistics.linear_regression(*zip(*points))
    console.print(f"peak MiB ≈ {intercept:,.0f} + {slope * 1e3:,.0f}·(tokens/1000) (least squares over the "
                  f"{len(points)} processes): memory follows the token share; the constant is what every "
                  f"member holds whatever its share (gathered weights, the other groups' K/V in the ring)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="global batch (sequences), even")
    parser.add_argument("--ring-seq-len", type=int, default=2048, help="sequence plans: tokens per sequence")
    parser.add_argument("--ring-batch", type=int, default=2, help="sequence plans: global batch")
    parser.add_argument("--sequence-steps", type=int, default=4, help="sequence plans: steps per run")
    parser.add_argument("--sequence-only", action="store_true", help="only the sequence-plan tables")
    args = parser.parse_args()
    if args.sequence_only:
        sequence_tables(args, Console())
        return
    config = make_config(args)
    rows = [("runtime, 2 pipelines × TP 1", 2, runtime(config, args.batch)),
            ("torch DDP (gloo)", 2, ddp(config, args.batch)),
            ("single process, 1 thread", 1, single_process(config, args.batch, 1)),
            ("single process, 2 threads", 1, single_process(config, args.batch, 2))]
    ddp_rate = rows[1][2]
    table = Table(title=f"runtime throughput: L={args.layers} h={args.hidden} seq {args.seq_len} "
                        f"B={args.batch}, median of steps {WARMUP_STEPS + 1}..{args.steps}")
    for column in ("training", "processes", "tokens/s", "vs DDP"):
        table.add_column(column, justify="right")
    for name, procs, rate in rows:
        table.add_row(name, str(procs), f"{rate:,.0f}", f"{rate / ddp_rate:.2f}×")
    console = Console()
    console.print(table)
    ratio = rows[0][2] / ddp_rate
    console.print(f"runtime / DDP tokens/s = {ratio:.2f} (target ≥ 0.85, within 15% of DDP): "
                  f"{'[green]met' if ratio >= 0.85 else '[red]not met'}")
    sequence_tables(args, console)


if __name__ == "__main__":
    main()
