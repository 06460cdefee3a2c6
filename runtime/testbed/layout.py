"""Cluster file → emulated-cluster layout (docs/testbed.md): pure, no `ip`, no torch.

Each machine of the cluster becomes a network namespace with one interface (`eth0`) joined by
a veth pair to a bridge in a hub namespace of its own, so neither the host's interfaces nor
another testbed's are touched. Addresses are 10.77.0.0/16, machine i at 10.77.(i // 254).(i % 254 + 1).

Rates. The cluster file's inter-machine figures (the default `inter_bw_gbps`, racks, per-pair
links and the vendor bridge, as `Cluster.bw_matrix` reads them) are multiplied by ONE factor,
`scale`, so that the emulated cluster fits this host: the fastest link at most
`MAX_LINK_MBIT` and all machines' links together at most `HOST_MBIT`. One factor keeps every
ratio between links, so a plan priced on `scaled_cluster(cluster, scale)` is priced for the
testbed. A machine's own link (its NIC) runs at its fastest pair's rate; a pair slower than
that gets a class of its own under it (htb), so flows to different peers share the NIC and
flows to a slow peer are held to that pair's rate.
"""

from __future__ import annotations

import ipaddress
import re

import numpy as np
from pydantic import Field

from planner.base import Frozen
from planner.hardware import Cluster

SUBNET = "10.77.0.0/16"
# The fastest emulated link. On this 2-core host one unshaped veth pair through the bridge
# carried 5.8 Gbit/s on one TCP flow, with both cores busy moving it; shaped at 800 Mbit/s it
# carries 760 (95 %: htb counts whole Ethernet frames, TCP's payload is 1448 of each 1514 bytes)
# and leaves the cores to the ranks that compute. Every link is held to its rate, not to the CPU.
MAX_LINK_MBIT = 800.0
# All machines' links at once: 3 links at the fastest rate, well under the unshaped 5.8 Gbit/s.
HOST_MBIT = 2400.0
MIN_LINK_MBIT = 1.0  # below this, tc's rate tables lose precision (and a step takes minutes)
# The fastest rate a --scale may ask for: an unshaped veth carried 5.8 Gbit/s here, so a shaper
# set 10× above that shapes nothing, and the links would no longer keep the file's ratios.
MAX_ASKED_MBIT = 58000.0
MBIT_PER_GBPS = 8000.0  # GB/s (10^9 bytes) → Mbit/s (10^6 bits)
MACHINE_INTERFACE = "eth0"
BRIDGE = "br0"


class MachineSlot(Frozen):
    """One machine of the cluster as a namespace."""

    index: int = Field(ge=0, description="machine index in the cluster file")
    name: str = Field(min_length=1, description="machine name in the cluster file (it resolves in the testbed)")
    host_name: str = Field(min_length=1, max_length=63, description="its host name: the name where it is a valid "
                           "one, else made one (docs/testbed.md §1); unique in the testbed")
    namespace: str = Field(min_length=1, description="network namespace name")
    address: str = Field(description="its own address on the testbed's subnet")
    interface: str = Field(default=MACHINE_INTERFACE, description="its interface inside the namespace")
    hub_interface: str = Field(min_length=1, max_length=15, description="the veth end on the hub's bridge")
    link_mbit: float = Field(gt=0, description="its link's shaped rate, Mbit/s (its fastest pair)")
    planned_gbps: float = Field(gt=0, description="the cluster file's figure for that link, GB/s")


class PairRate(Frozen):
    """A machine pair held below the faster machine's link rate (htb class of its own)."""

    a: int = Field(ge=0, description="machine index")
    b: int = Field(ge=0, description="machine index")
    mbit: float = Field(gt=0, description="shaped rate, Mbit/s")
    planned_gbps: float = Field(gt=0, description="the cluster file's figure, GB/s")


class TestbedLayout(Frozen):
    """Everything `Testbed` creates, by name: computed before anything is created."""

    __test__ = False  # a pydantic type, not a pytest class

    prefix: str = Field(min_length=1, description="every namespace's name starts with it")
    hub: str = Field(min_length=1, description="the hub namespace holding the bridge")
    scale: float = Field(gt=0, description="shaped rate / the cluster file's rate, every link alike")
    machines: tuple[MachineSlot, ...] = Field(min_length=1, description="in cluster order")
    pairs: tuple[PairRate, ...] = Field(default=(), description="pairs slower than their machines' links")

    def slot(self, machine: int | str) -> MachineSlot:
        """A machine by index or by name."""
        if isinstance(machine, str):
            found = [m for m in self.machines if m.name == machine]
            if not found:
                raise KeyError(f"no machine {machine!r} in the testbed (have {', '.join(m.name for m in self.machines)})")
            return found[0]
        return self.machines[machine]

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.hub, *(m.namespace for m in self.machines))

    def pair_mbit(self, a: int, b: int) -> float:
        """The rate a flow from machine a to machine b is shaped to (alone on both links)."""
        own = min(self.machines[a].link_mbit, self.machines[b].link_mbit)
        held = [p.mbit for p in self.pairs if {p.a, p.b} == {a, b}]
        return min([own, *held])

    def hosts_file(self, machine: int, loopback_own_name: bool = False) -> str:
        """/etc/hosts inside machine's namespace: every machine's host name → its address (only
        host names: `a b` would make two aliases, `box_1#x` comment out the rest of its line).
        `loopback_own_name`: the machine's own name → 127.0.1.1 first, as Debian and Ubuntu
        install it (gloo then binds a loopback address: the failure issue 32 reproduced)."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost"]
        if loopback_own_name:
            lines.append(f"127.0.1.1 {self.machines[machine].host_name}")
        lines += [f"{m.address} {m.host_name}" for m in self.machines]
        return "\n".join(lines) + "\n"


def machine_address(index: int) -> str:
    """10.77.0.1, 10.77.0.2, …: 254 machines per /24, never .0 or .255."""
    net = ipaddress.ip_network(SUBNET)
    if index >= 254 * 256:
        raise ValueError(f"{index + 1} machines do not fit {SUBNET}")
    return str(net.network_address + (index // 254) * 256 + index % 254 + 1)


def inter_gbps(cluster: Cluster) -> np.ndarray:
    """Machine × machine inter bandwidth, GB/s (bridge included), 0 on the diagonal."""
    bw = np.array(cluster.bw_matrix, dtype=float)
    np.fill_diagonal(bw, 0.0)
    return bw


def fitting_scale(cluster: Cluster) -> float:
    """The one factor that fits the cluster on this host: its fastest link at MAX_LINK_MBIT,
    lowered further if all machines' links together would pass HOST_MBIT."""
    bw = inter_gbps(cluster) * MBIT_PER_GBPS
    if len(cluster.machines) < 2:
        return MAX_LINK_MBIT / (cluster.inter_bw_gbps * MBIT_PER_GBPS)
    links = bw.max(axis=1)
    return float(min(MAX_LINK_MBIT / links.max(), HOST_MBIT / links.sum()))


def name_part(text: str) -> str:
    """A machine name made safe for a namespace name (letters, digits, dash)."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", text).strip("-")[:24] or "m"


HOST_NAME_MAX = 63  # RFC 1123: one label of a host name
VALID_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def is_host_name(text: str) -> bool:
    """A valid single-label host name: letters, digits and inner dashes, at most 63, not all
    digits (a number resolves as an address: `--master-addr 0` is 0.0.0.0)."""
    return bool(VALID_HOST_NAME.fullmatch(text)) and not text.isdigit()


def host_label(text: str) -> str:
    """`text` made a valid host name: runs of other characters → one dash, trimmed to 63;
    an all-digit or empty result gets an `m` in front."""
    label = re.sub(r"[^A-Za-z0-9-]+", "-", text).strip("-")[:HOST_NAME_MAX].strip("-")
    return label if label and not label.isdigit() else f"m{label}"[:HOST_NAME_MAX]


def host_names(names: list[str]) -> list[str]:
    """One distinct valid host name per machine (resolvers ignore case, so distinct ignoring
    case): a name that is already valid keeps itself; the others take `host_label`, and one that
    meets a name taken already gets `-<machine index>` (its label cut to make room)."""
    taken = {n.lower() for n in names if is_host_name(n)}
    result = []
    for i, name in enumerate(names):
        if is_host_name(name) and name.lower() not in {r.lower() for r in result}:
            result.append(name)
            continue
        label, k = host_label(name), 0
        while label.lower() in taken or label.lower() in {r.lower() for r in result}:
            suffix = f"-{i}" + (f"-{k}" if k else "")
            label, k = host_label(name)[:HOST_NAME_MAX - len(suffix)].rstrip("-") + suffix, k + 1
        taken.add(label.lower())
        result.append(label)
    return result


def check_rates(slowest_gbps: float, fastest_gbps: float, scale: float, asked: bool) -> None:
    """Raise ValueError (one line) when `scale` puts the slowest link below MIN_LINK_MBIT or the
    fastest above MAX_ASKED_MBIT. No scale at all can when the file's fastest/slowest ratio passes
    MAX_ASKED_MBIT / MIN_LINK_MBIT: then say that, not "choose a larger scale"."""
    ratio = fastest_gbps / slowest_gbps
    if ratio > MAX_ASKED_MBIT / MIN_LINK_MBIT:
        raise ValueError(f"its links range from {slowest_gbps:g} to {fastest_gbps:g} GB/s, a ratio of {ratio:,.0f}: "
                         f"one scale keeps every link's ratio, and the testbed shapes {MIN_LINK_MBIT:g} to "
                         f"{MAX_ASKED_MBIT:,.0f} Mbit/s (at most {MAX_ASKED_MBIT / MIN_LINK_MBIT:,.0f}), so no "
                         f"scale fits: bring the file's links closer")
    with np.errstate(over="ignore"):  # a huge --scale overflows to inf, which the check below refuses
        slowest, fastest = (float(np.float64(g) * scale * MBIT_PER_GBPS) for g in (slowest_gbps, fastest_gbps))
    what = f"--scale {scale:g}" if asked else f"the fitting scale {scale:.3g}"
    if slowest < MIN_LINK_MBIT:
        raise ValueError(f"{what} shapes the slowest link to {slowest:.3g} Mbit/s, below {MIN_LINK_MBIT:g} "
                         f"Mbit/s: choose a larger scale")
    if not fastest <= MAX_ASKED_MBIT:
        raise ValueError(f"{what} shapes the fastest link to {fastest:.3g} Mbit/s, above {MAX_ASKED_MBIT:g} "
                         f"Mbit/s (10× what a veth carries here, so nothing would be shaped): choose a smaller "
                         f"scale, or none for the fitting one")


def plan_layout(cluster: Cluster, prefix: str, scale: float | None = None) -> TestbedLayout:
    """The layout of `cluster` under `prefix`: namespaces, addresses, shaped rates (`scale`:
    None picks `fitting_scale`). Raises ValueError when a link would fall below MIN_LINK_MBIT."""
    asked = scale is not None
    scale = scale if asked else fitting_scale(cluster)
    bw = inter_gbps(cluster)
    n = len(cluster.machines)
    link_gbps = bw.max(axis=1) if n > 1 else np.array([cluster.inter_bw_gbps])
    check_rates(float(bw[bw > 0].min() if n > 1 else link_gbps[0]), float(link_gbps.max()), scale, asked)
    hosts = host_names([m.name for m in cluster.machines])
    machines = tuple(MachineSlot(index=i, name=m.name, host_name=hosts[i],
                                 namespace=f"{prefix}-{i}-{name_part(m.name)}",
                                 address=machine_address(i), hub_interface=f"m{i}",
                                 link_mbit=float(link_gbps[i]) * scale * MBIT_PER_GBPS,
                                 planned_gbps=float(link_gbps[i]))
                     for i, m in enumerate(cluster.machines))
    pairs = tuple(PairRate(a=i, b=j, mbit=float(bw[i, j]) * scale * MBIT_PER_GBPS, planned_gbps=float(bw[i, j]))
                  for i in range(n) for j in range(i + 1, n)
                  if bw[i, j] < min(link_gbps[i], link_gbps[j]) * (1 - 1e-9))
    return TestbedLayout(prefix=prefix, hub=f"{prefix}-hub", scale=scale, machines=machines, pairs=pairs)


def scaled_cluster(cluster: Cluster, scale: float) -> Cluster:
    """`cluster` with every inter-machine bandwidth (default, racks, links, vendor bridge)
    multiplied by `scale`: the cluster the testbed emulates, for pricing plans run on it.
    Intra-machine figures stay (ranks of one namespace talk over its unshaped loopback)."""
    data = cluster.model_dump()  # rebuilt, not model_copy: a copy would keep the cached bw tables
    data["inter_bw_gbps"] *= scale
    data["cross_vendor_bw_gbps"] *= scale
    for entry in (*data["racks"], *data["links"]):
        entry["bw_gbps"] *= scale
    return Cluster.model_validate(data)
