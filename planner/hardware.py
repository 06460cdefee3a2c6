"""GPU types, the built-in catalog, machines and clusters (docs/plan-space.md §1).

Devices get global integer ids in file order; `Cluster` precomputes the per-device arrays
that the cost model indexes, so that evaluating a plan never walks Python objects per device.

Links between machines are stored sparsely (`planner.pairs.PairTable`): a default, per-machine
rack ids with one figure per rack, and a sorted table of per-pair overrides, read for arrays of
machine pairs at once; a cluster that mixes nvidia and amd machines adds its cross-vendor
bridge (docs/vendors.md §8) to both tables, so every reading is bridged. A dense machine × machine
matrix is built only for small clusters (the exact solvers read it); at 10^5 GPUs it would
take gigabytes.
"""

from __future__ import annotations

from collections import Counter
from enum import Enum
from functools import cached_property, lru_cache
from importlib import resources

import numpy as np
import yaml
from pydantic import Field, model_validator

from planner.base import GIB, TFLOPS, US, Input, Name, OptionalName
from planner.pairs import NOT_BRIDGED, Bridge, PairTable
from planner.base import plural

# A bandwidth at or below 1 kB/s is a unit mistake (GB/s written as bytes/s or Gbit/s · 1e-9),
# never a real link: refused rather than priced into hour-long iterations.
MIN_BW_GBPS = 1e-6

# Upper limits on the figures of a cluster file, each far beyond any real hardware: a larger
# figure is a typo or a unit mistake, and past them the arithmetic overflows or allocates
# without end (a count of 10^15 devices asked numpy for petabytes).
MAX_TFLOPS = 1e6  # dense bf16 peak per device; the fastest GPUs reach a few 10^3
MIN_TFLOPS = 1e-6  # a megaflop/s: below it an iteration's seconds overflow (1e-300 had priced T as nan)
MAX_MEMORY_GIB = 1e6  # per device (and reserved_gib); the largest hold a few hundred GiB
MAX_BW_GBPS = 1e6  # any link; NVLink 5 gives 1.8·10^3 GB/s
MAX_LATENCY_US = 1e9  # any latency: 1000 s
MAX_PRICE = 1e9  # per device-hour, in any currency
MAX_MACHINE_DEVICES = 4096  # devices sharing one intra bandwidth; NVLink domains reach 72–576
MAX_CLUSTER_DEVICES = 2**22  # about 4·10^6 devices, 40 times the 10^5-GPU clusters planned in tests


class Vendor(str, Enum):
    nvidia = "nvidia"
    amd = "amd"
    other = "other"


class GpuType(Input):
    name: Name = Field(description="catalog name, e.g. A100-80G")
    vendor: Vendor = Field(default=Vendor.other, description="nvidia | amd | other")
    peak_tflops: float = Field(ge=MIN_TFLOPS, le=MAX_TFLOPS, allow_inf_nan=False, description="dense bf16 peak, TFLOP/s")
    memory_gib: float = Field(gt=0, le=MAX_MEMORY_GIB, allow_inf_nan=False, description="device memory, GiB")
    efficiency: float = Field(
        default=0.5, gt=0, le=1, description="achievable fraction of peak on transformer GEMMs"
    )
    attention_efficiency: float | None = Field(
        default=None, gt=0, le=1,
        description="η_att, achievable fraction of peak in the attention kernel (default: efficiency)")
    price_per_hour: float | None = Field(
        default=None, ge=0, le=MAX_PRICE, allow_inf_nan=False,
        description="price of one device for one hour (docs/prices.md §13), in one currency across the file")

    @property
    def effective_flops(self) -> float:
        """π of docs/cost-model.md §3 in FLOP/s: peak · η."""
        return self.peak_tflops * self.efficiency * TFLOPS

    @property
    def attention_eta(self) -> float:
        """η_att, or η where the type gives none."""
        return self.efficiency if self.attention_efficiency is None else self.attention_efficiency

    @property
    def effective_attention_flops(self) -> float:
        """π_att of docs/cost-model.md §3 in FLOP/s: peak · η_att."""
        return self.peak_tflops * self.attention_eta * TFLOPS


@lru_cache(maxsize=1)
def builtin_catalog() -> dict[str, GpuType]:
    """The GPU types that ship with hexiscale (instances/gpus.yaml)."""
    text = resources.files("instances").joinpath("gpus.yaml").read_text()
    entries = yaml.safe_load(text)["gpu_types"]
    return {e["name"]: GpuType(**e) for e in entries}


class Machine(Input):
    name: Name = Field(description="unique machine name")
    gpu: Name = Field(description="GPU type name (catalog or cluster gpu_types)")
    count: int = Field(ge=1, le=MAX_MACHINE_DEVICES, description="number of devices")
    intra_bw_gbps: float = Field(gt=MIN_BW_GBPS, le=MAX_BW_GBPS, allow_inf_nan=False,
                                 description="bandwidth between its own GPUs, GB/s")
    intra_latency_us: float | None = Field(
        default=None, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False,
        description="overrides the cluster's intra_latency_us"
    )
    price_per_hour: float | None = Field(
        default=None, ge=0, le=MAX_PRICE, allow_inf_nan=False,
        description="price of one of its devices for one hour (overrides its GPU type's; docs/prices.md §13)")


class Link(Input):
    a: Name = Field(description="machine name")
    b: Name = Field(description="machine name")
    bw_gbps: float = Field(gt=MIN_BW_GBPS, le=MAX_BW_GBPS, allow_inf_nan=False,
                           description="bandwidth between the two machines, GB/s")
    latency_us: float | None = Field(default=None, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False,
                                     description="overrides inter_latency_us")

    @model_validator(mode="after")
    def _distinct(self) -> Link:
        if self.a == self.b:
            raise ValueError(f"link joins machine {self.a!r} to itself; use intra_bw_gbps")
        return self


class Rack(Input):
    """Machines joined pairwise at one bandwidth (a switch): every pair of its machines gets
    `bw_gbps` unless a link overrides that pair. A machine is in at most one rack."""

    name: OptionalName = Field(default="", description="rack name (informational)")
    machines: tuple[Name, ...] = Field(min_length=2, description="machine names")
    bw_gbps: float = Field(gt=MIN_BW_GBPS, le=MAX_BW_GBPS, allow_inf_nan=False,
                           description="bandwidth between any two of its machines, GB/s")
    latency_us: float | None = Field(default=None, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False,
                                     description="overrides inter_latency_us")


def _check_racks(racks: tuple[Rack, ...], known: set[str]) -> None:
    """Rack members exist, and no machine is in two racks (which figure counts would be a guess)."""
    home: dict[str, int] = {}
    for r, rack in enumerate(racks):
        for name in rack.machines:
            if name not in known:
                raise ValueError(f"racks[{r}] names unknown machine {name!r}")
            j = home.setdefault(name, r)
            if j != r:
                raise ValueError(f"machine {name!r} is in racks[{j}] and racks[{r}]")
        repeated = sorted(n for n, c in Counter(rack.machines).items() if c > 1)
        if repeated:
            raise ValueError(f"racks[{r}] lists machines {repeated} twice")


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


# Up to this many machines the dense machine × machine matrices exist (8 bytes a pair: 32 MiB
# each at the limit); the exact solvers, which only run on small clusters, read them.
DENSE_MACHINES = 2048
# Up to this many machines pair lookups read the dense matrices (one fancy index, the fastest
# reading in the heuristic's inner loop); above, the sparse table. Both give the same figures.
DENSE_LOOKUP_MACHINES = 1024


class Cluster(Input):
    name: Name = Field(default="cluster", description="cluster name")
    machines: tuple[Machine, ...] = Field(min_length=1, description="machines in device-id order")
    inter_bw_gbps: float = Field(gt=MIN_BW_GBPS, le=MAX_BW_GBPS, allow_inf_nan=False,
                                 description="default bandwidth between machines, GB/s")
    intra_latency_us: float = Field(default=5.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False,
                                    description="default latency inside a machine")
    inter_latency_us: float = Field(default=30.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False,
                                    description="default latency between machines")
    racks: tuple[Rack, ...] = Field(
        default=(), description="groups of machines joined pairwise at one bandwidth (links override pairs)")
    links: tuple[Link, ...] = Field(default=(), description="per machine-pair overrides")
    cross_vendor_bw_gbps: float = Field(
        default=10.0, gt=MIN_BW_GBPS, le=MAX_BW_GBPS, allow_inf_nan=False,
        description="bridge bandwidth between nvidia and amd devices, GB/s (docs/vendors.md §8)")
    cross_vendor_latency_us: float = Field(
        default=50.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False,
        description="bridge latency added between nvidia and amd devices, µs (docs/vendors.md §8)")
    gpu_types: tuple[GpuType, ...] = Field(
        default=(), description="types added to, or overriding, the built-in catalog"
    )

    @model_validator(mode="after")
    def _check_size(self) -> Cluster:
        """The whole cluster stays within MAX_CLUSTER_DEVICES: the per-device arrays are built
        from the counts before anything else looks at them."""
        total = sum(m.count for m in self.machines)
        if total > MAX_CLUSTER_DEVICES:
            raise ValueError(f"machines hold {total:,} devices in all, more than the {MAX_CLUSTER_DEVICES:,} "
                             "a cluster may have")
        return self

    @model_validator(mode="after")
    def _check_gpu_types(self) -> Cluster:
        """A type defined twice in gpu_types: which definition counts would be a guess."""
        dupes = sorted(n for n, c in Counter(g.name for g in self.gpu_types).items() if c > 1)
        if dupes:
            raise ValueError(f"gpu_types names must be unique; repeated: {dupes}")
        return self

    @model_validator(mode="after")
    def _check_references(self) -> Cluster:
        names = [m.name for m in self.machines]
        dupes = sorted(n for n, c in Counter(names).items() if c > 1)
        if dupes:
            raise ValueError(f"machine names must be unique; repeated: {dupes}")
        known = set(names)
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in known:
                    raise ValueError(f"links[{i}] names unknown machine {end!r}")
        _check_link_pairs(self.links)
        _check_racks(self.racks, known)
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
    def machine_index(self) -> dict[str, int]:
        return {m.name: i for i, m in enumerate(self.machines)}

    @cached_property
    def machine_flops(self) -> np.ndarray:
        """π per machine (FLOP/s per device): peak · η of its GPU type."""
        return np.array([self.gpu_of(i).effective_flops for i in range(len(self.machines))])

    @cached_property
    def machine_attention_flops(self) -> np.ndarray:
        """π_att per machine (FLOP/s per device): peak · η_att of its GPU type."""
        return np.array([self.gpu_of(i).effective_attention_flops for i in range(len(self.machines))])

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

    # -- links (docs/plan-space.md §1), stored sparsely ---------------------------------------------
    @cached_property
    def machine_intra_bw(self) -> np.ndarray:
        """Each machine's intra bandwidth, GB/s (the diagonal of bw)."""
        return np.array([m.intra_bw_gbps for m in self.machines], dtype=float)

    @cached_property
    def machine_intra_lat(self) -> np.ndarray:
        """Each machine's intra latency, seconds (the diagonal of lat)."""
        return np.array([(m.intra_latency_us if m.intra_latency_us is not None else self.intra_latency_us) * US
                         for m in self.machines], dtype=float)

    @cached_property
    def machine_rack(self) -> np.ndarray:
        """Rack id of each machine (index into `racks`), -1 for none."""
        rack = np.full(len(self.machines), -1, dtype=np.int64)
        for r, group in enumerate(self.racks):
            rack[[self.machine_index[name] for name in group.machines]] = r
        return rack

    @cached_property
    def machine_bridge_side(self) -> np.ndarray:
        """Each machine's side of the cross-vendor bridge (docs/vendors.md §8): 0 nvidia, 1 amd,
        NOT_BRIDGED for `other` (an unknown vendor is never bridged)."""
        side = {Vendor.nvidia: 0, Vendor.amd: 1, Vendor.other: NOT_BRIDGED}
        return np.array([side[self.gpu_of(i).vendor] for i in range(len(self.machines))], dtype=np.int64)

    @property
    def mixes_vendors(self) -> bool:
        """Whether the cluster holds both nvidia and amd machines (traffic crosses a bridge)."""
        return bool({0, 1} <= set(self.machine_bridge_side.tolist()))

    def _bridge(self, value: float, join) -> Bridge | None:
        return Bridge(side=self.machine_bridge_side, value=value, join=join) if self.mixes_vendors else None

    def _overrides(self, figure) -> tuple[np.ndarray, np.ndarray]:
        """Sorted pair keys i·n + j (i < j) and values of the links that set `figure`."""
        n, index = len(self.machines), self.machine_index
        found = {}
        for link in self.links:
            value = figure(link)
            if value is not None:
                i, j = sorted((index[link.a], index[link.b]))
                found[i * n + j] = value
        keys = np.array(sorted(found), dtype=np.int64)
        return keys, np.array([found[k] for k in keys.tolist()], dtype=float)

    @cached_property
    def bw_table(self) -> PairTable:
        """bw between machines in GB/s, sparse."""
        keys, values = self._overrides(lambda link: link.bw_gbps)
        return PairTable(own=self.machine_intra_bw, default=float(self.inter_bw_gbps), rack=self.machine_rack,
                         rack_value=np.array([r.bw_gbps for r in self.racks], dtype=float),
                         keys=keys, values=values, bridge=self._bridge(self.cross_vendor_bw_gbps, "min"))

    @cached_property
    def lat_table(self) -> PairTable:
        """latency between machines in seconds, sparse; a link or rack without a latency
        leaves the pair at the next figure down (rack, then inter_latency_us)."""
        keys, values = self._overrides(lambda link: None if link.latency_us is None else link.latency_us * US)
        inter = self.inter_latency_us * US
        return PairTable(own=self.machine_intra_lat, default=inter, rack=self.machine_rack,
                         rack_value=np.array([inter if r.latency_us is None else r.latency_us * US
                                              for r in self.racks], dtype=float),
                         keys=keys, values=values, bridge=self._bridge(self.cross_vendor_latency_us * US, "add"))

    def _dense(self, table: PairTable, what: str) -> np.ndarray:
        n = len(self.machines)
        if n > DENSE_MACHINES:
            raise ValueError(
                f"{what}: a dense machine × machine matrix of {plural(n, 'machine')} ({8 * n * n / 2**30:.1f} GiB) is only "
                f"built up to {DENSE_MACHINES} machines; read pairs with Cluster.pair_bw / pair_lat")
        return table.dense()

    @cached_property
    def bw_matrix(self) -> np.ndarray:
        """bw between machines in GB/s; the diagonal holds each machine's intra bandwidth.
        Small clusters only (up to DENSE_MACHINES machines): use `pair_bw` elsewhere."""
        return self._dense(self.bw_table, "bw_matrix")

    @cached_property
    def lat_matrix(self) -> np.ndarray:
        """latency between machines in seconds; the diagonal holds intra latencies.
        Small clusters only (up to DENSE_MACHINES machines): use `pair_lat` elsewhere."""
        return self._dense(self.lat_table, "lat_matrix")

    @property
    def dense_lookup(self) -> bool:
        """Whether pair lookups read the dense matrices (small clusters) or the sparse tables."""
        return len(self.machines) <= DENSE_LOOKUP_MACHINES

    def pair_bw(self, mi, mj) -> np.ndarray:
        """bw between machines mi and mj (broadcast integer arrays), GB/s."""
        return self.bw_matrix[mi, mj] if self.dense_lookup else self.bw_table(mi, mj)

    def pair_lat(self, mi, mj) -> np.ndarray:
        """latency between machines mi and mj (broadcast integer arrays), seconds."""
        return self.lat_matrix[mi, mj] if self.dense_lookup else self.lat_table(mi, mj)

    # -- prices (docs/prices.md §13) ------------------------------------------------------------
    def device_price(self, m: int) -> float | None:
        """Machine m's price of one device for one hour: its own, else its GPU type's, else None."""
        own = self.machines[m].price_per_hour
        return own if own is not None else self.gpu_of(m).price_per_hour

    @cached_property
    def machine_prices(self) -> np.ndarray:
        """Each machine's price per device-hour (NaN where it has none)."""
        prices = [self.device_price(m) for m in range(len(self.machines))]
        return np.array([np.nan if p is None else p for p in prices], dtype=float)

    @cached_property
    def machine_rent(self) -> np.ndarray:
        """What renting each whole machine costs per hour: count × price (NaN where unpriced)."""
        return self.machine_counts * self.machine_prices

    @cached_property
    def priced(self) -> bool:
        """Whether every machine has a price (its own or its GPU type's)."""
        return not bool(np.isnan(self.machine_prices).any())

    def unpriced_machine(self) -> int | None:
        """The first machine without a price, or None when every machine has one."""
        missing = np.flatnonzero(np.isnan(self.machine_prices))
        return int(missing[0]) if missing.size else None

    @cached_property
    def total_peak_flops(self) -> float:
        """Σ peak over every device of the cluster (idle devices count in MFU)."""
        return float(sum(m.count * self.gpu_of(i).peak_tflops * TFLOPS
                         for i, m in enumerate(self.machines)))

    def bw(self, i: int, j: int) -> float:
        """bw(i, j) of docs/plan-space.md §1 (bridged, §8) between global devices i and j, GB/s."""
        return float(self.pair_bw(self.machine_of_device[i], self.machine_of_device[j]))

    def lat(self, i: int, j: int) -> float:
        """lat(i, j) between global devices i and j, seconds."""
        return float(self.pair_lat(self.machine_of_device[i], self.machine_of_device[j]))
