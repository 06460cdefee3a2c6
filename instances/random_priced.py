"""Seeded tiny priced problems (docs/prices.md §13): the judge set on which every objective's exact
answer, and every frontier point, is checked against brute force.

`random_priced(seed, kind)` takes the model, training and GPU memory sizes of
`random_small(seed, tiny=True)` (≤ 6 layers, memory from well under one replica's states) and
puts them on a cluster with a choice of what to rent: 2–4 machines of 1–2 devices (at most 4
GPUs: well inside brute force's reach) of 1–3 GPU types, uneven links, and
- a price per device-hour on every GPU type, roughly in proportion to its peak with a ±50 %
  spread, in steps of $0.05 (so that different machine sets sometimes cost the same: ties);
  one machine in three overrides its type's price, and now and then a machine is free (0);
- an objective: `time` alone, `time` with a budget, or `cost` (with a budget one time in three);
- a budget between the cheapest machine's rent and the whole cluster's (some below what any
  plan that fits in memory rents: infeasible on purpose).
`kind="sequence"` turns the sequence into 2q·u tokens (q ∈ {16, 32, 64}, u ∈ 1..4) as the
sequence solvers' tiny problems do (tests/test_sequence_solvers.py).

`priced_problems(count, kind)` lists `count` of them (seeds 0..count−1). Same seed, same
problem; nothing reads global random state.
"""

from __future__ import annotations

import random

from instances.random_small import INTER_BW, INTRA_BW, PEAKS, random_small
from planner.hardware import Cluster, GpuType, Link, Machine
from planner.problem import Objective, Problem

MAX_DEVICES = 4  # brute force takes up to 40 s on some 5-GPU problems, under 2 s at 4 (both kinds, 2 cores)
PRICE_STEP = 0.05  # $ per device-hour
PRICE_PER_TFLOPS = 0.004  # a device of 400 TFLOP/s costs about $1.60/h, as public on-demand lists do


def _price(rng: random.Random, peak_tflops: float) -> float:
    raw = PRICE_PER_TFLOPS * peak_tflops * rng.uniform(0.5, 1.5)
    return max(PRICE_STEP, round(raw / PRICE_STEP) * PRICE_STEP)


def machine_counts(rng: random.Random) -> list[int]:
    """2–4 machines of 1–2 devices, at most MAX_DEVICES in all: a choice of what to rent."""
    counts = [rng.choice([1, 1, 2]) for _ in range(rng.randint(2, 4))]
    while sum(counts) > MAX_DEVICES:
        if len(counts) > 2:
            counts.pop()
        else:
            counts[counts.index(max(counts))] = 1
    return counts


def gpu_types(rng: random.Random, base: Cluster, kinds: int) -> list[GpuType]:
    """`kinds` priced types: random_small's own (memory scaled to the model), then copies at
    another peak and memory."""
    types = list(base.gpu_types)
    while len(types) < kinds:
        like = rng.choice(base.gpu_types)
        types.append(like.model_copy(update={"name": f"G{len(types)}", "peak_tflops": rng.choice(PEAKS),
                                             "memory_gib": like.memory_gib * rng.choice([0.5, 1.0, 2.0])}))
    return [t.model_copy(update={"price_per_hour": _price(rng, t.peak_tflops)}) for t in types[:kinds]]


def priced_cluster(rng: random.Random, base: Cluster) -> Cluster:
    """2–4 machines of 1–3 priced GPU types (random_small's memory sizes), one machine in three
    with its own price (some free), uneven links."""
    counts = machine_counts(rng)
    types = gpu_types(rng, base, rng.randint(min(2, len(counts)), min(3, len(counts))))
    machines = []
    for i, c in enumerate(counts):
        gpu, draw = types[i % len(types)] if i < len(types) else rng.choice(types), rng.random()
        own = 0.0 if draw < 0.05 else _price(rng, gpu.peak_tflops) if draw < 0.35 else None
        machines.append(Machine(name=f"n{i}", gpu=gpu.name, count=c, intra_bw_gbps=rng.choice(INTRA_BW),
                                price_per_hour=own))
    links = tuple(Link(a=f"n{i}", b=f"n{j}", bw_gbps=rng.choice(INTER_BW), latency_us=rng.choice([5.0, 30.0, 200.0]))
                  for i in range(len(counts)) for j in range(i + 1, len(counts)) if rng.random() < 0.5)
    return Cluster(name="random-priced", machines=tuple(machines), inter_bw_gbps=rng.choice(INTER_BW),
                   links=links, gpu_types=tuple(types))


def _goal(rng: random.Random, cluster: Cluster) -> dict:
    """objective and budget_per_hour (see the module text)."""
    rents = sorted(float(r) for r in cluster.machine_rent)
    low, high = rents[0], float(sum(rents))
    budget = round(rng.uniform(low, high) / PRICE_STEP) * PRICE_STEP if high > 0 else 0.0
    budget = budget if budget > 0 else None
    draw = rng.random()
    if draw < 0.35:
        return {"objective": Objective.time, "budget_per_hour": None}
    if draw < 0.7:
        return {"objective": Objective.time, "budget_per_hour": budget}
    return {"objective": Objective.cost, "budget_per_hour": budget if rng.random() < 1 / 3 else None}


def random_priced(seed: int, kind: str = "layered") -> Problem:
    """One tiny priced problem of plan kind `kind` (see the module text)."""
    rng = random.Random(f"random-priced/{seed}/{kind}")
    base = random_small(seed, max_devices=MAX_DEVICES, tiny=True)
    training = base.training
    if kind == "sequence":
        q, units = rng.choice([16, 32, 64]), rng.randint(1, 4)
        training = training.model_copy(update={"seq_len": 2 * q * units, "token_block": q})
    elif kind != "layered":
        raise ValueError(f"unknown plan kind {kind!r} (layered or sequence)")
    cluster = priced_cluster(rng, base.cluster)
    return Problem(name=f"random-priced-{kind}-{seed}", cluster=cluster, model=base.model, training=training,
                   **_goal(rng, cluster))


def priced_problems(count: int = 100, kind: str = "layered") -> list[Problem]:
    """`count` tiny priced problems (seeds 0..count−1)."""
    return [random_priced(seed, kind) for seed in range(count)]
