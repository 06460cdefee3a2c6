"""Seeded random tiny problems for the exact-solver tests: mixed GPU types, uneven links,
memory-tight cases (and, by construction, some infeasible ones)."""

from __future__ import annotations

import random

from planner.base import GIB

from planner.hardware import Cluster, GpuType, Link, Machine
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec


def random_problem(seed: int, max_devices: int = 4, max_layers: int = 4, max_micro: int = 4) -> Problem:
    rng = random.Random(seed)
    model = ModelSpec(name=f"m{seed}", layers=rng.randint(2, max_layers), hidden=rng.choice([256, 512, 1024]),
                      heads=4, kv_heads=rng.choice([2, 4]), ffn_hidden=rng.choice([512, 1024, 2048]),
                      vocab=rng.choice([1000, 8000, 32000]), gated=rng.random() < 0.7)
    micro = rng.choice([1, 2])
    training = TrainingSpec(seq_len=rng.choice([512, 2048, 4096]), micro_batch=micro,
                            global_batch=micro * rng.randint(1, max_micro),
                            recompute=rng.random() < 0.6, reserved_gib=0.0)
    return Problem(name=f"random-{seed}", cluster=_cluster(rng, model, max_devices), model=model,
                   training=training)


def _cluster(rng: random.Random, model: ModelSpec, max_devices: int) -> Cluster:
    counts = []
    while sum(counts) < rng.randint(1, max_devices) and len(counts) < 3:
        counts.append(rng.choice([1, 1, 2, 2, 4]))
    while sum(counts) > max_devices:
        counts[-1] -= 1
        counts = [c for c in counts if c]
    # memory scaled to the model: from "half the states per device" (tight) to "all of it"
    states = 16 * model.total_params
    types = [GpuType(name=f"G{i}", peak_tflops=rng.choice([20.0, 60.0, 150.0, 400.0]),
                     memory_gib=states * rng.choice([0.4, 1.0, 3.0, 3.0]) / GIB, efficiency=0.5)
             for i in range(len(counts))]
    machines = tuple(Machine(name=f"n{i}", gpu=f"G{i}", count=c, intra_bw_gbps=rng.choice([16.0, 100.0, 300.0]),
                             intra_latency_us=rng.choice([2.0, 5.0]))
                     for i, c in enumerate(counts))
    links = tuple(Link(a=f"n{i}", b=f"n{j}", bw_gbps=rng.choice([0.5, 3.0, 12.5]), latency_us=rng.choice([10.0, 40.0]))
                  for i in range(len(counts)) for j in range(i + 1, len(counts)) if rng.random() < 0.6)
    return Cluster(name="random", machines=machines, inter_bw_gbps=rng.choice([1.25, 6.25]),
                   links=links, gpu_types=tuple(types))
