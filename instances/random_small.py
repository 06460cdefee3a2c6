"""Seeded random small problems nobody chose: the heuristic's judge set (issue: quality on
problems that were not tuned for).

`random_small(seed)` returns a planner `Problem` with 2–8 GPUs (machines of 1–8 GPUs, one GPU
type each, several types with varied speed and memory), uneven per-pair links and latencies
(some links far slower than the default), memory-tight models (per-device memory from well
under one replica's states to several), and batches of few micro-batches. `tiny=True` keeps
a problem inside brute force's reach (≤ 5 GPUs, ≤ 6 layers, docs/formulation.md §5).

Same seed, same problem; nothing reads global random state.
"""

from __future__ import annotations

import random

from planner.base import GIB
from planner.hardware import Cluster, GpuType, Link, Machine
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec

MACHINE_SIZES = (1, 1, 2, 2, 3, 4, 4, 8)  # devices per machine (3: a TP remainder)
PEAKS = (20.0, 60.0, 150.0, 400.0, 990.0)  # TFLOP/s
MEMORY_OF_STATES = (0.4, 0.7, 1.0, 1.5, 2.5, 4.0, 8.0)  # device memory / one replica's model states
INTER_BW = (0.5, 1.25, 3.0, 6.25, 12.5, 25.0)  # GB/s
INTRA_BW = (16.0, 64.0, 100.0, 300.0)


def random_small(seed: int, *, max_devices: int = 8, tiny: bool = False) -> Problem:
    """One random small problem (see the module docstring)."""
    rng = random.Random(f"random-small/{seed}/{max_devices}/{tiny}")
    max_devices = min(max_devices, 5) if tiny else max_devices
    model = _model(rng, seed, max_layers=6 if tiny else 8)
    micro = rng.choice([1, 1, 2, 4])
    training = TrainingSpec(seq_len=rng.choice([512, 1024, 2048, 4096]), micro_batch=micro,
                            global_batch=micro * rng.choice([1, 2, 3, 4, 5, 6, 8]),
                            recompute=rng.random() < 0.6, reserved_gib=rng.choice([0.0, 0.0, 0.5]),
                            schedule="gpipe" if rng.random() < 0.15 else "1f1b")
    cluster = _cluster(rng, model, max_devices, training.reserved_gib)
    return Problem(name=f"random-small-{seed}" + ("-tiny" if tiny else ""), cluster=cluster, model=model,
                   training=training)


def _model(rng: random.Random, seed: int, max_layers: int) -> ModelSpec:
    heads = rng.choice([4, 8])
    return ModelSpec(name=f"rs{seed}", layers=rng.randint(2, max_layers), hidden=rng.choice([256, 512, 1024, 2048]),
                     heads=heads, kv_heads=rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0]),
                     ffn_hidden=rng.choice([512, 1024, 4096]), vocab=rng.choice([1000, 8000, 32000]),
                     gated=rng.random() < 0.7)


def _counts(rng: random.Random, max_devices: int) -> list[int]:
    """Machine sizes: at least 2 devices in all, at most `max_devices`, at most 4 machines."""
    target = rng.randint(2, max_devices)
    counts: list[int] = []
    while sum(counts) < target and len(counts) < 4:
        counts.append(min(rng.choice(MACHINE_SIZES), target - sum(counts)))
    return counts


def _cluster(rng: random.Random, model: ModelSpec, max_devices: int, reserved_gib: float) -> Cluster:
    counts = _counts(rng, max_devices)
    states = 16 * model.total_params  # μ·P of one replica, bytes
    kinds = rng.randint(1, min(3, len(counts)))  # several machines may share a type
    types = [GpuType(name=f"G{i}", peak_tflops=rng.choice(PEAKS),
                     memory_gib=states * rng.choice(MEMORY_OF_STATES) / GIB + reserved_gib,
                     efficiency=rng.choice([0.4, 0.5, 0.6])) for i in range(kinds)]
    machines = tuple(Machine(name=f"n{i}", gpu=f"G{rng.randrange(kinds)}", count=c,
                             intra_bw_gbps=rng.choice(INTRA_BW), intra_latency_us=rng.choice([2.0, 5.0, 10.0]))
                     for i, c in enumerate(counts))
    links = tuple(Link(a=f"n{i}", b=f"n{j}", bw_gbps=rng.choice(INTER_BW),
                       latency_us=rng.choice([5.0, 30.0, 200.0, 2000.0]))
                  for i in range(len(counts)) for j in range(i + 1, len(counts)) if rng.random() < 0.7)
    return Cluster(name="random-small", machines=machines, inter_bw_gbps=rng.choice(INTER_BW),
                   inter_latency_us=rng.choice([10.0, 30.0, 100.0]), links=links, gpu_types=tuple(types))
