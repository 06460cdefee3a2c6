"""`profile` across the machines of an emulated cluster (docs/testbed.md, docs/calibration.md §9):
the profile's simulated machine i is the testbed's machine i, each rank runs inside that
machine's network namespace, and "between machines" is then a shaped link — the inter class
measures the network, the intra class each machine's loopback. Beside it,
`direct_latencies` times 4-byte messages between two machines (`runtime.profiling.round_trip`)
to hold the fitted latency against.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from runtime.profiling.launcher import ProfileResult, ProfileSpec, Starter, launch_profile, repo_root
from runtime.testbed import Testbed

ROUND_TRIP_REPEATS = 400
ROUND_TRIP_TIMEOUT_S = 120.0


def check_fits(bed: Testbed, spec: ProfileSpec) -> None:
    have = len(bed.layout.machines)
    if len(spec.machines) > have:
        raise ValueError(f"the profile's {len(spec.machines)} machines do not fit the testbed's {have}")


def testbed_starter(bed: Testbed, spec: ProfileSpec) -> Starter:
    """Each rank inside its machine's namespace, gloo bound to that machine's interface (the
    ranks of one machine reach each other's address over its loopback, unshaped)."""
    machine_of = [m for m, count in enumerate(spec.machines) for _ in range(count)]

    def start(rank: int, argv: list[str], env: dict, log) -> subprocess.Popen:
        slot = bed.slot(machine_of[rank])
        env.setdefault("GLOO_SOCKET_IFNAME", slot.interface)
        return bed.start(slot.index, argv, env=env, cwd=repo_root(), stdout=log, stderr=subprocess.STDOUT)

    return start


def profile_on_testbed(bed: Testbed, spec: ProfileSpec, folder: Path, on_progress=None) -> ProfileResult:
    """`launch_profile` with machine i's ranks inside the testbed's machine i; the master is
    machine 0's address."""
    check_fits(bed, spec)
    return launch_profile(spec, folder, on_progress, testbed_starter(bed, spec), master=bed.address(0))


def direct_latencies(bed: Testbed, spec: ProfileSpec, a: int | str = 0, b: int | str = 1,
                     repeats: int = ROUND_TRIP_REPEATS, port: int = 29620) -> dict:
    """{operation: {"median_us", "mean_us", "fastest_us", "repeats"}} between machines a (rank 0)
    and b: a 4-byte ping-pong's one way and a 4-byte all-reduce's α through gloo, back to back
    ("p2p", "all_reduce") and after `spec`'s compute gap as the profile times them ("p2p after
    compute", "all_reduce after compute"), and a raw TCP one-byte ping-pong's one way ("tcp")."""
    with tempfile.TemporaryDirectory(prefix="hexiscale-round-trip-") as folder:
        out = Path(folder) / "round_trip.json"
        (Path(folder) / "spec.json").write_text(spec.model_dump_json())
        procs = []
        for rank, machine in enumerate((a, b)):
            slot = bed.slot(machine)
            argv = [sys.executable, "-m", "runtime.profiling.round_trip", str(rank), bed.address(a), str(port),
                    str(repeats), str(out), str(Path(folder) / "spec.json")]
            procs.append(bed.start(machine, argv, cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=_env(slot.interface)))
        logs = [p.communicate(timeout=ROUND_TRIP_TIMEOUT_S)[0] for p in procs]
        failed = [i for i, p in enumerate(procs) if p.returncode != 0]
        if failed:
            lines = logs[failed[0]].strip().splitlines()
            raise RuntimeError(f"round trip rank {failed[0]} failed: {lines[-1] if lines else 'no output'}")
        return json.loads(out.read_text())


def _env(interface: str) -> dict:
    import os

    return {**os.environ, "GLOO_SOCKET_IFNAME": interface, "OMP_NUM_THREADS": "1", "LOCAL_WORLD_SIZE": "2",
            "PYTHONPATH": os.pathsep.join([str(repo_root()), os.environ.get("PYTHONPATH", "")])}
