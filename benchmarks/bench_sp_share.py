"""A TP-2 rank's compute against one device's, with and without sequence parallelism
(docs/cost-model.md §3.1 and §3.5, issue 31).

    .venv/bin/python benchmarks/bench_sp_share.py [--model medium|small] [--repeats 30]

§3.1 prices a TP stage's compute C_σ as the whole stage's divided by t: a TP-2 rank does 0.5 of
the work. Without sequence parallelism it does more: the norms, residual adds and the copies
around them run on every token on both ranks (the calibration bench measured a TP-2 rank at
0.57–0.62 of the whole). Sequence parallelism splits those over the sequence too.

What is timed is what C_σ prices, a rank's compute alone: one forward and backward of one
micro-batch (the calibration bench's model: 8 layers, s = 128, b = 1, fp32, no recompute) by
the runtime's own `StageModel` — one device holding the whole stage, and rank 0 of a TP-2
stage without and with sequence parallelism — in this one process, with the TP collectives
replaced by local stand-ins that return tensors of the right shapes (an all-gather's copies,
a reduce-scatter's block): no waiting on a peer, no second process on the cores. The three
are timed in turn, `--repeats` rounds; the minimum of each (the least disturbed by the
machine's other work) and the median are printed, with their share of the one device's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_calibration import MODELS, TRAINING  # noqa: E402
from runtime.layered.layout import StageRanks  # noqa: E402
from runtime.layered.stage import StageModel  # noqa: E402


class LocalStandIn:
    """The communicator's TP collectives as tensors of the shapes a group of 2 returns, at no
    cost of their own (what the collectives cost is T_tp's, not C's): the copies the stage
    makes around them (the clone before an all-reduce, the concatenation after an all-gather,
    the sequence-first copy before a reduce-scatter) stay in the time."""

    def all_reduce(self, tensor, group, op="sum"):
        return tensor

    def all_gather(self, tensor, group):
        return [tensor, tensor]

    def reduce_scatter(self, tensor, group):
        return tensor.narrow(0, 0, tensor.shape[0] // 2)


def stage(tp: int, sequence_parallel: bool, model: str) -> StageModel:
    ranks = tuple(range(tp))
    layout = StageRanks(pipeline=0, stage=0, ranks=ranks, devices=ranks, layer_start=0, layer_end=8,
                        first=True, last=True)
    group = object() if tp > 1 else None  # any object: the stand-in ignores it
    return StageModel(MODELS[model], layout, 0, group, TRAINING.seq_len, seed=0, comm=LocalStandIn(),
                      sequence_parallel=sequence_parallel)


def pass_seconds(model: StageModel, tokens: torch.Tensor) -> float:
    """One forward and backward of one micro-batch."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    model(tokens, tokens, 1.0).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=tuple(MODELS), default="medium")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per rank, as the runs have it
    torch.manual_seed(0)
    tokens = torch.randint(0, MODELS[args.model].vocab, (TRAINING.micro_batch, TRAINING.seq_len))
    stages = {"one device": stage(1, False, args.model), "TP 2": stage(2, False, args.model),
              "TP 2 + SP": stage(2, True, args.model)}
    times = {label: [] for label in stages}
    for _ in range(args.repeats + 2):  # the first two rounds warm up
        for label, model in stages.items():
            times[label].append(pass_seconds(model, tokens))
    best = {label: min(values[2:]) for label, values in times.items()}
    middle = {label: statistics.median(values[2:]) for label, values in times.items()}
    print(f"model {args.model}, s = {TRAINING.seq_len}, b = {TRAINING.micro_batch}, {args.repeats} rounds; "
          f"§3.1 prices a TP-2 rank at 0.50 of one device")
    for label in stages:
        print(f"{label:11s} min {best[label] * 1e3:7.1f} ms  share {best[label] / best['one device']:.3f}   "
              f"median {middle[label] * 1e3:7.1f} ms  share {middle[label] / middle['one device']:.3f}")


if __name__ == "__main__":
    main()
