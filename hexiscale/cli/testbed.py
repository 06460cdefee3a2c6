"""`hexiscale testbed up CLUSTER` / `down`: an emulated cluster on this host (docs/testbed.md):
one network namespace per machine, shaped links, a hosts file each; left up until `down`."""

from __future__ import annotations

import shlex
import signal

import typer
from rich.table import Table

from hexiscale.cli.app import app, console, fail, friendly_errors
from planner.base import plural
from planner.io import load_cluster
from runtime.testbed import PREFIX, Testbed, TestbedError, TestbedLayout, leftovers, remove_leftovers, unavailable_reason

EXIT_NO_TESTBED = 1
from hexiscale.interrupt import EXIT_INTERRUPTED
CLI_PREFIX = f"{PREFIX}cli"  # the command's own testbed; tests' testbeds have prefixes of their own

testbed_app = typer.Typer(no_args_is_help=True, help="Emulate a cluster on this host (network namespaces): up CLUSTER | down.")
app.add_typer(testbed_app, name="testbed")


def checked_host() -> None:
    reason = unavailable_reason()
    if reason:
        fail(reason, EXIT_NO_TESTBED)


def layout_table(layout: TestbedLayout) -> Table:
    table = Table(title=f"testbed {layout.prefix}: rates = the cluster file's × {layout.scale:.4g}")
    for column in ("machine", "namespace", "address", "link Mbit/s", "from GB/s"):
        table.add_column(column)
    for m in layout.machines:
        table.add_row(m.name, m.namespace, m.address, f"{m.link_mbit:,.1f}", f"{m.planned_gbps:g}")
    return table


def print_layout(layout: TestbedLayout, bed: Testbed) -> None:
    console.print(layout_table(layout))
    for pair in layout.pairs:
        console.print(f"pair {layout.machines[pair.a].name} ↔ {layout.machines[pair.b].name}: held to "
                      f"{pair.mbit:,.1f} Mbit/s (from {pair.planned_gbps:g} GB/s)", highlight=False)
    console.print("a shell on each machine (its own host name; its hosts file names every machine):",
                  highlight=False)
    for m in layout.machines:
        console.print(shlex.join(bed.command(m.index, ["bash"])), highlight=False, soft_wrap=True)
    console.print(f"run there what `hexiscale run PROBLEM PLAN --torchrun --master-addr {layout.machines[0].host_name}` "
                  f"prints for that machine; remove it all with `hexiscale testbed down`", highlight=False,
                  soft_wrap=True)


@testbed_app.command("up")
@friendly_errors
def up(cluster: str = typer.Argument(..., help="cluster file or bundled name"),
       scale: float = typer.Option(None, min=1e-9, help="shaped rate / the file's rate, every link alike "
                                   "(default: the fastest link at 800 Mbit/s, all links within 2.4 Gbit/s)"),
       loopback_own_name: bool = typer.Option(False, help="map each machine's own name to 127.0.1.1 in its hosts "
                                              "file, as Debian and Ubuntu do")) -> None:
    """Create the emulated cluster of CLUSTER and leave it up.

    Prints its namespaces, addresses, link rates and the commands that run inside
    each machine."""
    checked_host()
    if leftovers(CLI_PREFIX):
        fail(f"a testbed is already up ({', '.join(leftovers(CLI_PREFIX))}): `hexiscale testbed down` first")
    loaded = load_cluster(cluster)  # its errors name the file already
    try:
        bed = Testbed(loaded, scale=scale, loopback_own_name=loopback_own_name, prefix=CLI_PREFIX)
    except ValueError as exc:
        fail(f"{cluster}: {exc}")
    build_and_keep(bed)


def build_and_keep(bed: Testbed) -> None:
    """Build the testbed, print it, then keep it up — all under the context manager's signal
    handling, so that SIGINT or SIGTERM before `keep` tears everything down (interpreter exit
    never runs the teardown a signal skips) and says so in one line. After `keep` the testbed is
    up and fully printed: a later signal leaves it for `down`."""
    try:
        with bed:
            print_layout(bed.layout, bed)
            bed.keep()
    except TestbedError as exc:
        fail(str(exc), EXIT_NO_TESTBED)
    except KeyboardInterrupt:
        for signum in (signal.SIGINT, signal.SIGTERM):  # more Ctrl-C now would only cut the line short
            signal.signal(signum, signal.SIG_IGN)
        fail("interrupted: the testbed was torn down, nothing of it is left", EXIT_INTERRUPTED)


@testbed_app.command("down")
@friendly_errors
def down(every: bool = typer.Option(False, "--all", help=f"every testbed's leftovers ({PREFIX}*), not only "
                                    "this command's: also those of running tests")) -> None:
    """Remove the testbed `up` made: its processes, namespaces (with their links) and hosts files."""
    checked_host()
    removed = remove_leftovers(PREFIX if every else CLI_PREFIX)
    if not any(removed.values()):
        console.print("nothing to remove: no testbed is up", highlight=False)
        return
    count = len(removed["processes"])
    console.print(f"removed {plural(len(removed['namespaces']), 'namespace')} (with their links and shaping), "
                  f"{count} process{'' if count == 1 else 'es'} inside them, "
                  f"{plural(len(removed['hosts folders']), 'hosts folder')}, "
                  f"{plural(len(removed['temp folders']), 'temporary folder')}", highlight=False, soft_wrap=True)
    for ns in removed["namespaces"]:
        console.print(f"  {ns}", highlight=False)
