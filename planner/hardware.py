"""GPU types, the built-in catalog, machines and clusters (DESIGN.md §1).

Devices get global integer ids in file order; `Cluster` precomputes the per-device and
per-machine-pair arrays that the cost model indexes, so that evaluating a plan never walks
Python objects per device.
"""

from __future__ import annotations

from enum import Enum
from functools import cached_property, lru_cache
from importlib import resources

import numpy as np
import yaml
from pydantic import Field, model_validator

from planner.base import GIB, TFLOPS, US, Frozen

# A bandwidth at or below 1 kB/s is a unit mistake (GB/s written as bytes/s or Gbit/s · 1e-9),
# never a real link: refused rather than priced into hour-long iterations.
MIN_BW_GBPS = 1e-6


class Vendor(str, Enum):
    nvidia = "nvidia"
    amd = "amd"
    other = "other"


class GpuType(Frozen):
    name: str = Field(min_length=1, description="catalog name, e.g. A100-80G")
    vendor: Vendor = Field(default=Vendor.other, description="nvidia | amd | other")
    peak_tflops: float = Field(gt=0, allow_inf_nan=False, description="dense bf16 peak, TFLOP/s")
    memory_gib: float = Field(gt=0, allow_inf_nan=False, description="device memory, GiB")
    efficiency: float = Field(
        default=0.5, gt=0, le=1, description="achievable fraction of peak on transformer GEMMs"
    )

    @property
    def effective_flops(self) -> float:
        """π of DESIGN.md §3 in FLOP/s: peak · η."""
        return self.peak_tflops * self.efficiency * TFLOPS


@lru_cache(maxsize=1)
def builtin_catalog() -> dict[str, GpuType]:
    """The GPU types that ship with hexiscale (instances/gpus.yaml)."""
    text = resources.files("instances").joinpath("gpus.yaml").read_text()
    entries = yaml.safe_load(text)["gpu_types"]
    return {e["name"]: GpuType(**e) for e in entries}


class Machine(Frozen):
    name: str = Field(min_length=1, description="unique machine name")
    gpu: str = Field(min_length=1, description="GPU type name (catalog or cluster gpu_types)")
    count: int = Field(ge=1, description="number of devices")
    intra_bw_gbps: float = Field(gt=MIN_BW_GBPS, allow_inf_nan=False, description="bandwidth between its own GPUs, GB/s")
    intra_latency_us: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="overrides the cluster's intra_latency_us"
    )


class Link(Frozen):
    a: str = Field(description="machine name")
    b: str = Field(description="machine name")
    bw_gbps: float = Field(gt=MIN_BW_GBPS, allow_inf_nan=False, description="bandwidth between the two machines, GB/s")
    latency_us: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="overrides inter_latency_us")

    @model_validator(mode="after")
    def _distinct(self) -> Link:
        if self.a == self.b:
            raise ValueError(f"link joins machine {self.a!r} to itself; use intra_bw_gbps")
        return self


def _check_link_pairs(links: tuple[Link, ...]) -> None:
    """Two links for one machine pair must agree: otherwise which one counts is a guess."""
    seen: dict[frozenset[str], int] = {}
    for i, link in enumerate(links):
        pair = frozenset((link.a, link.b))
        j = seen.setdefault(pair, i)
        other = links[j]
        if j != i and (other.bw_gbps, other.latency_us) != (link.bw_gbps, link.latency_us):
            raise ValueError(
                f"links[{j}] and links[{i}] both join {link.a} and {link.b} with different figures "
                f"({other.bw_gbps:g} vs {link.bw_gbps:g} GB/s, latency {other.latency_us} vs {link.latency_us} µs)")


class Cluster(Frozen):
    name: str = Field(default="cluster", description="cluster name")
    machines: tuple[Machine, ...] = Field(min_length=1, description="machines in device-id order")
    inter_bw_gbps: float = Field(gt=MIN_BW_GBPS, allow_inf_nan=False, description="default bandwidth between machines, GB/s")
    intra_latency_us: float = Field(default=5.0, ge=0, allow_inf_nan=False, description="default latency inside a machine")
    inter_latency_us: float = Field(default=30.0, ge=0, allow_inf_nan=False, description="default latency between machines")
    links: tuple[Link, ...] = Field(default=(), description="per machine-pair overrides")
    gpu_types: tuple[GpuType, ...] = Field(
        default=(), description="types added to, or overriding, the built-in catalog"
    )

    @model_validator(mode="after")
    def _check_references(self) -> Cluster:
        names = [m.name for m in self.machines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"machine names must be unique; repeated: {dupes}")
        known = set(names)
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in known:
                    raise ValueError(f"links[{i}] names unknown machine {end!r}")
        _check_link_pairs(self.links)
        catalog = self.catalog
        for i, m in enumerate(self.machines):
            if m.gpu not in catalog:
                raise ValueError(
                    f"machines[{i}] ({m.name}) has unknown GPU type {m.gpu!r}; "
                    f"known: {', '.join(sorted(catalog))}"
                )
        return self

    # -- derived views (computed once per cluster) ----------------------------------------
    @cached_property
    def catalog(self) -> dict[str, GpuType]:
        return {**builtin_catalog(), **{g.name: g for g in self.gpu_types}}

    def gpu_of(self, machine: int) -> GpuType:
        return self.catalog[self.machines[machine].gpu]

    @cached_property
    def num_devices(self) -> int:
        return sum(m.count for m in self.machines)

    @cached_property
    def machine_of_device(self) -> np.ndarray:
        """machine index of each global device id."""
        return np.repeat(np.arange(len(self.machines)), [m.count for m in self.machines])

    @cached_property
    def first_device(self) -> np.ndarray:
        """global id of each machine's device 0."""
        return np.concatenate([[0], np.cumsum([m.count for m in self.machines])[:-1]]).astype(int)

    def devices_of(self, machine: int) -> list[int]:
        start = int(self.first_device[machine])
        return list(range(start, start + self.machines[machine].count))

    @cached_property
    def machine_flops(self) -> np.ndarray:
        """π per machine (FLOP/s per device): peak · η of its GPU type."""
        return np.array([self.gpu_of(i).effective_flops for i in range(len(self.machines))])

    @cached_property
    def machine_peak_flops(self) -> np.ndarray:
        return np.array([self.gpu_of(i).peak_tflops * TFLOPS for i in range(len(self.machines))])

    @cached_property
    def machine_counts(self) -> np.ndarray:
        """devices per machine."""
        return np.array([m.count for m in self.machines])

    @cached_property
    def machine_memory_bytes(self) -> np.ndarray:
        return np.array([self.gpu_of(i).memory_gib * GIB for i in range(len(self.machines))])

    @cached_property
    def bw_matrix(self) -> np.ndarray:
        """bw between machines in GB/s; the diagonal holds each machine's intra bandwidth."""
        n = len(self.machines)
        bw = np.full((n, n), self.inter_bw_gbps, dtype=float)
        index = {m.name: i for i, m in enumerate(self.machines)}
        for link in self.links:
            i, j = index[link.a], index[link.b]
            bw[i, j] = bw[j, i] = link.bw_gbps
        np.fill_diagonal(bw, [m.intra_bw_gbps for m in self.machines])
        return bw

    @cached_property
    def lat_matrix(self) -> np.ndarray:
        """latency between machines in seconds; the diagonal holds intra latencies."""
        n = len(self.machines)
        lat = np.full((n, n), self.inter_latency_us * US, dtype=float)
        index = {m.name: i for i, m in enumerate(self.machines)}
        for link in self.links:
            if link.latency_us is not None:
                i, j = index[link.a], index[link.b]
                lat[i, j] = lat[j, i] = link.latency_us * US
        intra = [
            (m.intra_latency_us if m.intra_latency_us is not None else self.intra_latency_us) * US
            for m in self.machines
        ]
        np.fill_diagonal(lat, intra)
        return lat

    @cached_property
    def total_peak_flops(self) -> float:
        """Σ peak over every device of the cluster (idle devices count in MFU)."""
        return float(sum(m.count * self.gpu_of(i).peak_tflops * TFLOPS
                         for i, m in enumerate(self.machines)))

    def bw(self, i: int, j: int) -> float:
        """bw(i, j) of DESIGN.md §1 between global devices i and j, GB/s."""
        return float(self.bw_matrix[self.machine_of_device[i], self.machine_of_device[j]])

    def lat(self, i: int, j: int) -> float:
        """lat(i, j) between global devices i and j, seconds."""
        return float(self.lat_matrix[self.machine_of_device[i], self.machine_of_device[j]])
