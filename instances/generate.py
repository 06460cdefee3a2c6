"""Synthetic heterogeneous clusters for tests and scaling benchmarks.

`generate_cluster(gpus, mix, seed)` is a pure function: the same arguments always give the
same `Cluster`. Machines hold 4 or 8 GPUs of one type; machines are grouped into racks (a
rack holds machines of similar types, as racks are bought in one go), rack-internal links are
fast, the default between racks is slow, and a few machine pairs get a degraded link, so the
bandwidth graph is uneven the way real shared clusters are.

All bandwidths here are illustrative GUESSES in GB/s, not measurements.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from planner.hardware import builtin_catalog, Cluster, Link, Machine, Rack
from planner.io import load_model, problem_to_dict, save_yaml
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec

# Intra-machine bandwidth (GB/s) by GPU type: NVLink/xGMI figures for SXM/OAM parts (effective,
# about half the bidirectional datasheet number), PCIe 4.0/5.0 effective figures otherwise.
INTRA_BW_GBPS = {
    "A100-40G": 300, "A100-80G": 300, "A800-80G": 400, "H100": 450, "H800": 400, "H20": 900,
    "H200": 450, "V100": 150, "MI250X": 200, "MI300X": 448,
}
PCIE_DATACENTER_GBPS = 25.0  # PCIe 4.0 x16 peaks at 32 GB/s; ~80 % effective with P2P
PCIE_GEFORCE_GBPS = 16.0  # GeForce cards: no P2P, traffic bounces through host memory
RACK_BW_CHOICES_GBPS = (12.5, 25.0)  # 100 GbE or 200 Gb/s InfiniBand inside a rack
CROSS_RACK_BW_GBPS = 3.125  # 25 GbE share between racks
DEGRADED_BW_GBPS = 1.25  # a flaky / oversubscribed pair: 10 GbE
MACHINES_PER_RACK = 8
GPUS_PER_UNIT = 4  # machines hold 4 or 8 GPUs, so GPU counts are allocated in units of 4


def parse_mix(mix: str | dict[str, float]) -> dict[str, float]:
    """"A100-80G:0.25,RTX4090:0.5,H20:0.25" → {type: weight}, weights normalised to sum 1."""
    if isinstance(mix, str):
        pairs = {}
        for item in filter(None, (x.strip() for x in mix.split(","))):
            name, sep, weight = item.partition(":")
            if not sep:
                raise ValueError(f"mix entry {item!r} is not TYPE:WEIGHT")
            try:
                pairs[name.strip()] = float(weight)
            except ValueError:
                raise ValueError(f"mix entry {item!r}: weight {weight!r} is not a number") from None
        mix = pairs
    catalog = builtin_catalog()
    unknown = sorted(set(mix) - set(catalog))
    if unknown:
        raise ValueError(f"unknown GPU types {unknown} in mix; known: {', '.join(sorted(catalog))}")
    if not mix or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError("mix needs at least one type with a positive weight and none negative")
    total = sum(mix.values())
    return {name: w / total for name, w in mix.items() if w > 0}


def intra_bw(gpu: str) -> float:
    if gpu in INTRA_BW_GBPS:
        return float(INTRA_BW_GBPS[gpu])
    return PCIE_GEFORCE_GBPS if gpu.startswith("RTX") else PCIE_DATACENTER_GBPS


def allocate_units(units: int, weights: dict[str, float]) -> dict[str, int]:
    """Split `units` (of 4 GPUs) among types by largest remainder; deterministic."""
    exact = {name: units * w for name, w in weights.items()}
    alloc = {name: math.floor(x) for name, x in exact.items()}
    by_remainder = sorted(exact, key=lambda n: (-(exact[n] - alloc[n]), n))
    for name in by_remainder[: units - sum(alloc.values())]:
        alloc[name] += 1
    return alloc


def machine_sizes(units: int, rng: np.random.Generator) -> list[int]:
    """Machines of 8 or 4 GPUs covering `units` × 4 GPUs (about a quarter are 4-GPU boxes)."""
    sizes = []
    while units > 0:
        if units >= 2 and rng.random() >= 0.25:
            sizes.append(8)
            units -= 2
        else:
            sizes.append(4)
            units -= 1
    return sizes


def _machines(gpus: int, weights: dict[str, float], rng: np.random.Generator) -> list[Machine]:
    machines = []
    for gpu, units in allocate_units(gpus // GPUS_PER_UNIT, weights).items():
        for i, size in enumerate(machine_sizes(units, rng)):
            name = f"{gpu.lower()}-{i}"
            machines.append(Machine(name=name, gpu=gpu, count=size, intra_bw_gbps=intra_bw(gpu)))
    return machines


def _racks_and_links(machines: list[Machine], rng: np.random.Generator) -> tuple[list[Rack], list[Link]]:
    """Racks of consecutive machines, each with one fast bandwidth between any two of its
    machines, plus a few degraded pairs anywhere (links, which override a rack's pair). A
    rack is one entry however many pairs it joins, so a 10^5-GPU cluster file stays small."""
    racks = []
    for start in range(0, len(machines), MACHINES_PER_RACK):
        rack = machines[start: start + MACHINES_PER_RACK]
        bw = float(rng.choice(RACK_BW_CHOICES_GBPS))  # drawn for a lone machine too: same stream
        if len(rack) > 1:
            racks.append(Rack(name=f"rack-{start // MACHINES_PER_RACK}", machines=tuple(m.name for m in rack),
                              bw_gbps=bw, latency_us=15.0))
    links = {}
    degraded = max(1, len(machines) // 8) if len(machines) > 2 else 0
    for _ in range(degraded):
        i, j = sorted(rng.choice(len(machines), size=2, replace=False).tolist())
        a, b = machines[i].name, machines[j].name
        links[(a, b)] = Link(a=a, b=b, bw_gbps=DEGRADED_BW_GBPS, latency_us=60.0)
    return racks, list(links.values())


def generate_cluster(gpus: int, mix: str | dict[str, float], seed: int = 0) -> Cluster:
    """A cluster of `gpus` devices (a multiple of 4) of the types in `mix`, reproducible by seed."""
    if gpus < GPUS_PER_UNIT or gpus % GPUS_PER_UNIT:
        raise ValueError(f"gpus must be a positive multiple of {GPUS_PER_UNIT}, got {gpus}")
    weights = parse_mix(mix)
    rng = np.random.default_rng(seed)
    machines = _machines(gpus, weights, rng)
    racks, links = _racks_and_links(machines, rng)
    return Cluster(
        name=f"gen-{gpus}-s{seed}", machines=tuple(machines),
        inter_bw_gbps=CROSS_RACK_BW_GBPS, inter_latency_us=40.0, racks=tuple(racks), links=tuple(links),
    )


def generated_problem(cluster: Cluster, model: str | ModelSpec = "llama2-70b", seq_len: int = 4096,
                      global_batch: int | None = None, micro_batch: int = 1,
                      recompute: bool = True, name: str | None = None) -> Problem:
    """Pair a (generated) cluster with a bundled model; the default global batch is one
    sequence per GPU, rounded up to a multiple of the micro-batch."""
    spec = load_model(model) if isinstance(model, str) else model
    batch = global_batch or -(-cluster.num_devices // micro_batch) * micro_batch
    training = TrainingSpec(seq_len=seq_len, global_batch=batch, micro_batch=micro_batch,
                            recompute=recompute)
    return Problem(name=name or f"{cluster.name}-{spec.name}", cluster=cluster, model=spec,
                   training=training)


def _save(data: dict, path: str | Path) -> None:
    """YAML, or JSON when the file name ends in .json (read about 10× faster at 10^5 GPUs)."""
    if Path(path).suffix == ".json":
        Path(path).write_text(json.dumps(data, indent=1) + "\n")
    else:
        save_yaml(data, path)


def write_cluster(cluster: Cluster, path: str | Path) -> None:
    """A cluster file that `planner.io.load_cluster` reads back to an equal Cluster."""
    _save(cluster.model_dump(mode="json", exclude_defaults=True), path)


def write_problem(problem: Problem, path: str | Path) -> None:
    """A self-contained problem file (cluster and model inline)."""
    _save(problem_to_dict(problem), path)
