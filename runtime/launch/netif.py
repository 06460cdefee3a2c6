"""Which network interface a machine's ranks bind (no torch): the one that routes to the master
address, so that gloo and NCCL advertise an address the other machines reach.

Left alone, gloo binds the address this host's name resolves to. Debian and Ubuntu map a
host's own name to 127.0.1.1, so each machine advertised a loopback address and its peers'
connections were refused (issue 32, reproduced on the testbed: "Gloo connectFullMesh failed …
Connection refused, remote=[127.0.1.1]"). Setting GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to
the interface whose address routes to the master avoids that; a master address that resolves to
loopback here while the run spans several machines cannot work and is refused in one line.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

from pydantic import Field

from planner.base import Frozen

SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class InterfaceError(RuntimeError):
    """No usable interface toward the master; the message is one line saying what to change."""


class Binding(Frozen):
    interface: str = Field(min_length=1, description="the interface the ranks bind")
    address: str = Field(description="its address (what the other machines connect to)")
    how: str = Field(description="why this one: routes to the master, or set in the environment")


def resolve(host: str) -> str:
    """`host`'s IPv4 address as this machine resolves it (its hosts file first)."""
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        raise InterfaceError(f"the master address {host} does not resolve here ({exc.strerror})") from None


def route_source(address: str) -> str:
    """The local address this machine sends from toward `address` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
        except OSError as exc:
            raise InterfaceError(f"no route to the master address {address} ({exc.strerror})") from None
        return probe.getsockname()[0]


def interface_address(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
        return socket.inet_ntoa(packed[20:24])


def interface_with(address: str) -> str | None:
    """The interface that holds `address`."""
    return next((name for _, name in socket.if_nameindex() if interface_address(name) == address), None)


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def choose_binding(master: str, machines: int, env: dict[str, str] | None = None) -> Binding:
    """The interface this machine's ranks bind for a run over `machines` machines whose
    rendezvous is at `master`. A GLOO_SOCKET_IFNAME already set wins. A master written as a
    loopback address (all machines on one host) binds loopback."""
    env = os.environ if env is None else env
    if env.get("GLOO_SOCKET_IFNAME"):
        name = env["GLOO_SOCKET_IFNAME"]
        return Binding(interface=name, address=interface_address(name) or "?", how="GLOO_SOCKET_IFNAME was set")
    address = resolve(master)
    written_loopback = master in LOOPBACK_NAMES or _literal_loopback(master)
    if machines > 1 and is_loopback(address) and not written_loopback:
        raise InterfaceError(
            f"the master address {master} resolves to {address} here, a loopback address (Debian and Ubuntu map "
            f"a host's own name so), while the run spans {machines} machines: give --master-addr an address every "
            f"machine reaches, or set GLOO_SOCKET_IFNAME")
    source = route_source(address)
    name = interface_with(source)
    if name is None:
        raise InterfaceError(f"no interface holds {source}, the address that routes to {master}: set GLOO_SOCKET_IFNAME")
    return Binding(interface=name, address=source, how=f"the interface that routes to the master address {master}")


def _literal_loopback(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def apply(binding: Binding, env: dict[str, str] | None = None) -> None:
    """Set the interface variables that are not set yet (inherited by the ranks)."""
    env = os.environ if env is None else env
    for var in IFNAME_VARS:
        env.setdefault(var, binding.interface)
