"""Runtime throughput: a homogeneous 2-process plan (two pipelines, TP 1, all layers) versus
plain single-process training and torch DDP on the same 2 processes — same model, same
global batch, same data. Target: the runtime within 15% of DDP.

    .venv/bin/python benchmarks/bench_runtime.py [--steps 8] [--hidden 256] [--seq-len 128]

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
from planner.workload import ModelSpec  # noqa: E402
from runtime.config import Job, RunConfig  # noqa: E402
from runtime.data import BatchLoader, make_source  # noqa: E402
from runtime.launch import free_port, launch_local  # noqa: E402
from runtime.model import ReferenceLlama  # noqa: E402

WARMUP = 2


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
    return statistics.median(rates[WARMUP:])


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
        results.put(statistics.median(rates[WARMUP:]))
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
    return statistics.median(s["tokens_per_s"] for s in result.steps[WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="global batch (sequences), even")
    args = parser.parse_args()
    config = make_config(args)
    rows = [("runtime, 2 pipelines × TP 1", 2, runtime(config, args.batch)),
            ("torch DDP (gloo)", 2, ddp(config, args.batch)),
            ("single process, 1 thread", 1, single_process(config, args.batch, 1)),
            ("single process, 2 threads", 1, single_process(config, args.batch, 2))]
    ddp_rate = rows[1][2]
    table = Table(title=f"runtime throughput: L={args.layers} h={args.hidden} seq {args.seq_len} "
                        f"B={args.batch}, median of steps {WARMUP + 1}..{args.steps}")
    for column in ("training", "processes", "tokens/s", "vs DDP"):
        table.add_column(column, justify="right")
    for name, procs, rate in rows:
        table.add_row(name, str(procs), f"{rate:,.0f}", f"{rate / ddp_rate:.2f}×")
    console = Console()
    console.print(table)
    ratio = rows[0][2] / ddp_rate
    console.print(f"runtime / DDP tokens/s = {ratio:.2f} (target ≥ 0.85, within 15% of DDP): "
                  f"{'[green]met' if ratio >= 0.85 else '[red]not met'}")


if __name__ == "__main__":
    main()
