"""The emulated cluster (runtime/testbed, docs/testbed.md): the layout a cluster file gives
(pure), the namespaces, links, shaping and hosts files `Testbed` makes, and that nothing is
left behind — after a clean exit, after a test that fails inside the block, after SIGTERM and
SIGINT, and after `hexiscale testbed up` / `down`."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.hardware import Cluster, Link, Machine
from planner.io import load_cluster
from runtime.testbed import MAX_LINK_MBIT, Testbed, fitting_scale, leftovers, namespaces, plan_layout, scaled_cluster
from tests.terminal import terminal_popen
from tests.testbed_helpers import (PYTHON, ROOT, needs_testbed, namespace_inodes, processes_in, state, test_prefix,
                                   wait_gone)

SERVER = textwrap.dedent("""
    import socket, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5001)); s.listen(1)
    c, _ = s.accept(); n, t0 = 0, None
    while (b := c.recv(1 << 20)):
        t0 = t0 or time.monotonic(); n += len(b)
    print(n * 8 / (time.monotonic() - t0) / 1e6)
""")
CLIENT = textwrap.dedent("""
    import socket, sys, time
    s = socket.create_connection((sys.argv[1], 5001)); buf = b"x" * (1 << 20); end = time.monotonic() + 2
    while time.monotonic() < end: s.sendall(buf)
    s.close()
""")
PAYLOAD_SHARE = 1448 / 1514  # TCP payload per Ethernet frame: what htb counts against what arrives


def four_machines() -> Cluster:
    return Cluster(machines=[Machine(name=f"box_{i}", gpu="RTX4090", count=1, intra_bw_gbps=16) for i in range(4)],
                   inter_bw_gbps=1.25, links=[Link(a="box_2", b="box_3", bw_gbps=5.0), Link(a="box_0", b="box_1",
                                                                                        bw_gbps=0.25)])


def test_layout_names_addresses_and_one_scale_for_every_link():
    layout = plan_layout(four_machines(), "hxtbx")
    assert layout.scale == pytest.approx(MAX_LINK_MBIT / (5.0 * 8000))  # the fastest link at 800 Mbit/s
    assert [m.address for m in layout.machines] == ["10.77.0.1", "10.77.0.2", "10.77.0.3", "10.77.0.4"]
    assert [m.namespace for m in layout.machines] == [f"hxtbx-{i}-box-{i}" for i in range(4)]
    assert layout.hub == "hxtbx-hub" and all(len(m.hub_interface) <= 15 for m in layout.machines)
    assert [m.link_mbit for m in layout.machines] == pytest.approx([200, 200, 800, 800])
    (held,) = layout.pairs  # box_0 ↔ box_1 is slower than both machines' links
    assert (held.a, held.b, held.mbit) == (0, 1, pytest.approx(40))
    assert layout.pair_mbit(0, 1) == pytest.approx(40) and layout.pair_mbit(0, 2) == pytest.approx(200)
    assert layout.machines[1].host_name == "box-1"  # '_' is no host name's
    assert "127.0.1.1" not in layout.hosts_file(1) and "10.77.0.2 box-1\n" in layout.hosts_file(1)
    debian = layout.hosts_file(1, loopback_own_name=True)
    assert debian.index("127.0.1.1 box-1") < debian.index("10.77.0.2 box-1")  # the first match wins


def test_scale_fits_the_host_and_scaled_cluster_prices_the_testbed():
    big = Cluster(machines=[Machine(name=f"m{i}", gpu="RTX4090", count=1, intra_bw_gbps=16) for i in range(8)],
                  inter_bw_gbps=12.5)
    assert fitting_scale(big) * 12.5 * 8000 * 8 == pytest.approx(2400)  # 8 links within the host's 2.4 Gbit/s
    tiny = load_cluster("tiny-4")
    scaled = scaled_cluster(tiny, 0.01)
    assert scaled.bw_matrix[0, 1] == pytest.approx(tiny.bw_matrix[0, 1] * 0.01)
    assert scaled.bw_matrix[1, 2] == pytest.approx(12.5 * 0.01) and scaled.machine_intra_bw[0] == 300
    with pytest.raises(ValueError, match="below 1 Mbit/s"):
        plan_layout(tiny, "hxtbx", scale=1e-6)
    for too_fast in (1.0, float("inf"), float("nan")):  # 1.0: tiny-4's 12.5 GB/s link at 100 Gbit/s
        with pytest.raises(ValueError, match="above 58000 Mbit/s"):
            plan_layout(tiny, "hxtbx", scale=too_fast)


@needs_testbed
def test_up_makes_resolving_shaped_machines_and_down_leaves_nothing():
    prefix = test_prefix()
    before = state(prefix)
    with Testbed(load_cluster("tiny-4"), prefix=prefix) as bed:
        inodes = namespace_inodes(bed)
        assert set(bed.layout.namespaces) <= set(namespaces())
        done = bed.run("r4090-0", ["sh", "-c", "hostname; getent hosts r4090-0 a100-0; tc qdisc show dev eth0"])
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == "r4090-0" and "10.77.0.2" in lines[1] and "10.77.0.1" in lines[2] and "htb" in done.stdout
        sleeper = bed.start(0, ["sleep", "300"])
        deadline = time.monotonic() + 10  # `ip netns exec` enters the namespace a moment after the start
        while not processes_in(inodes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_in(inodes)
    assert sleeper.poll() is not None and wait_gone(inodes) == []
    assert state(prefix) == before and bed.removed["namespaces"]


@needs_testbed
def test_a_test_failing_inside_the_block_leaves_nothing():
    prefix = test_prefix()
    before = state(prefix)
    with pytest.raises(AssertionError, match="planted"):
        with Testbed(load_cluster("tiny-2"), prefix=prefix) as bed:
            inodes = namespace_inodes(bed)
            bed.start(1, ["sleep", "300"])
            assert False, "planted failure"
    assert wait_gone(inodes) == [] and state(prefix) == before


BED_SCRIPT = """
import sys, time
from planner.io import load_cluster
from runtime.testbed import Testbed
with Testbed(load_cluster("tiny-2"), prefix=sys.argv[1]) as bed:
    bed.start(0, ["sleep", "300"])
    print("up", flush=True)
    time.sleep(300)
"""


@needs_testbed
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_tears_the_testbed_down(signum):
    prefix = test_prefix()
    before = state(prefix)
    proc = terminal_popen([PYTHON, "-c", BED_SCRIPT, prefix], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up", proc.stderr.read()
        assert leftovers(prefix)
        proc.send_signal(signum)
        proc.wait(timeout=30)
        assert "KeyboardInterrupt" in proc.stderr.read()
        assert state(prefix) == before
    finally:
        proc.kill()
        from runtime.testbed import remove_leftovers
        remove_leftovers(prefix)


@needs_testbed
@pytest.mark.slow
@pytest.mark.alone
def test_links_carry_their_shaped_rates():
    """Four machines at the fitting scale: box_2 ↔ box_3 at 800 Mbit/s, box_0's link at 200 and the
    box_0 ↔ box_1 pair held to 40 by a class of its own; a 2 s TCP flow's payload arrives at the
    shaped rate times TCP's payload share, within 5 %."""
    with Testbed(four_machines(), prefix=test_prefix()) as bed:
        for sender, receiver in ((2, 3), (2, 0), (0, 1)):
            server = bed.start(receiver, [PYTHON, "-c", SERVER], stdout=subprocess.PIPE, text=True)
            time.sleep(0.5)
            bed.run(sender, [PYTHON, "-c", CLIENT, bed.address(receiver)])
            carried = float(server.communicate(timeout=30)[0])
            shaped = bed.layout.pair_mbit(sender, receiver)
            assert carried == pytest.approx(shaped * PAYLOAD_SHARE, rel=0.05), (sender, receiver, carried, shaped)


@needs_testbed
def test_cli_up_prints_the_layout_and_down_removes_it():
    from hexiscale.cli.testbed import CLI_PREFIX

    before = state(CLI_PREFIX)
    assert not before["namespaces and hosts folders"], "a testbed of the command is already up"
    try:
        up = CliRunner().invoke(app, ["testbed", "up", "tiny-4"])
        assert up.exit_code == 0, up.output
        text = " ".join(up.output.split())
        assert "× 0.008" in text and "10.77.0.1" in text and "200.0" in text and "800.0" in text
        assert f"ip netns exec {CLI_PREFIX}-1-r4090-0 unshare --uts" in text
        again = CliRunner().invoke(app, ["testbed", "up", "tiny-4"])
        assert again.exit_code == 2 and "already up" in again.output
    finally:
        down = CliRunner().invoke(app, ["testbed", "down"])
    assert down.exit_code == 0 and "removed 4 namespaces" in " ".join(down.output.split())
    assert state(CLI_PREFIX) == before
    assert "nothing to remove" in CliRunner().invoke(app, ["testbed", "down"]).output


def test_a_host_that_cannot_is_one_line(monkeypatch):
    """Not root: one line saying so (the tests skip with it); the command exits 1 with it."""
    import hexiscale.cli.testbed as cli_testbed
    from runtime.testbed import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    reason = netns.unavailable_reason()
    assert reason.startswith("the emulated cluster needs root") and "\n" not in reason
    monkeypatch.setattr(cli_testbed, "unavailable_reason", lambda: reason)
    for argv in (["testbed", "up", "tiny-2"], ["testbed", "down"]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 1 and result.output.strip().startswith("error: the emulated cluster needs root")
        assert len(result.output.strip().splitlines()) <= 2  # one line, wrapped at most once by the terminal


def test_slowed_links_names_a_lasting_slowdown_against_the_prediction():
    """Pure: tiny-2 with one stage per machine at 8 Mbit/s predicts 0.066 s of exchange per step
    (4 micro-batches × 2 × 8 KiB fp32 activations); a one-step stall is not a slowed link."""
    from planner.io import load_problem
    from planner.layered.plan import Pipeline, Plan, Stage
    from runtime.launch.launcher import make_job
    from runtime.testbed.slow_links import crossing_boundaries, problem_on_testbed, slowed_links

    problem = load_problem("tiny-2-tiny")
    plan = Plan(pipelines=[Pipeline(batch=8, stages=[Stage(devices=[0], layers=2), Stage(devices=[1], layers=2)])])
    on_testbed = problem_on_testbed(problem, make_job(problem, plan, "tiny", seq_len=32), 0.0008)
    (boundary,) = crossing_boundaries(on_testbed, plan)
    assert (boundary.sender, boundary.receiver) == ("a100-0", "r4090-0")
    assert boundary.predicted_s == pytest.approx(4 * 2 * 2 * 32 * 32 * 4 / 1e6, rel=0.02)  # + 30 µs latencies

    def steps(comm: list[float]) -> list[dict]:
        return [{"step": i + 1, "stages": [{"pipeline": 0, "stage": k, "comm_s": c} for k in (0, 1)]}
                for i, c in enumerate(comm)]

    assert slowed_links(on_testbed, plan, steps([3.0, 0.1, 0.08, 0.6, 0.07, 0.09])) == []  # warm-up, one stall
    (line,) = slowed_links(on_testbed, plan, steps([3.0, 0.1, 0.08, 0.09, 0.6, 0.7, 0.65]))
    assert line.startswith("link a100-0 → r4090-0 (pipeline 0, stage 0 → 1) slowed from step 5: its exchange "
                           "took 0.65 s per step in 3 steps against 0.0658 s predicted (9.9×)"), line


def many_machines_file(tmp_path, count: int = 30) -> str:
    rows = "\n".join(f"  - {{name: m{i}, gpu: RTX4090, count: 1, intra_bw_gbps: 16}}" for i in range(count))
    path = tmp_path / "many.yaml"
    path.write_text(f"name: many\ninter_bw_gbps: 1.25\nmachines:\n{rows}\n")
    return str(path)


@needs_testbed
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_up_interrupted_during_the_build_and_its_cleanup_leaves_nothing(tmp_path, signum):
    """The first signal lands once the build has made a namespace; three SIGINTs follow during
    the teardown it starts: exit 130, one `error:` line, and every namespace, hosts folder,
    temporary folder and probe namespace gone."""
    from hexiscale.cli.testbed import CLI_PREFIX
    from runtime.testbed import PREFIX, remove_leftovers

    before = state(CLI_PREFIX)
    assert not before["namespaces and hosts folders"], "a testbed of the command is already up"
    proc = terminal_popen([str(ROOT / ".venv/bin/hexiscale"), "testbed", "up", many_machines_file(tmp_path)], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(leftovers(CLI_PREFIX)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signum)
        for _ in range(3):
            time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 130 and err.strip().splitlines() == [
            "error: interrupted: the testbed was torn down, nothing of it is left"], err
        assert state(CLI_PREFIX) == before
        assert not [ns for ns in leftovers(PREFIX) if "probe" in ns]
    finally:
        proc.kill()
        remove_leftovers(CLI_PREFIX)


def test_the_host_check_probe_is_a_testbed_namespace_and_down_takes_temp_folders(monkeypatch, tmp_path):
    """Pure (the commands recorded): the probe namespace is named under the testbed prefix, so
    `down --all` finds one a SIGKILL left; `remove_leftovers` removes the prefix's temp folders."""
    from runtime.testbed import PREFIX, netns, remove_leftovers

    calls = []
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: f"/sbin/{tool}")
    monkeypatch.setattr(netns, "sh", lambda *argv, check=True: calls.append(argv) or
                        subprocess.CompletedProcess(argv, 0, "", ""))
    assert netns.unavailable_reason() is None
    (add, delete) = calls
    assert add[:3] == ("ip", "netns", "add") and add[3].startswith(PREFIX) and delete == ("ip", "netns", "del", add[3])
    monkeypatch.setattr(netns.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / "hxtbcli-abc").mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.setattr(netns, "leftovers", lambda prefix: [])
    removed = remove_leftovers("hxtbcli")
    assert removed["temp folders"] == [str(tmp_path / "hxtbcli-abc")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


ODD_NAMES = ["a b", "a-b", "über", "机器", "机器二", "x" * 70 + "1", "x" * 70 + "2", "box_1#x", "-lead", "123", "0",
             "Box", "box", "m"]


def test_every_machine_gets_a_distinct_valid_host_name_and_the_hosts_file_only_those():
    """Names that sanitise alike, differ past 63 characters, differ only in case, are numbers or
    carry a '#': each gets its own RFC 1123 label; a name that is one keeps it."""
    import re

    cluster = Cluster(machines=[Machine(name=n, gpu="RTX4090", count=1, intra_bw_gbps=16) for n in ODD_NAMES],
                      inter_bw_gbps=1.25)
    layout = plan_layout(cluster, "hxtbx")
    hosts = [m.host_name for m in layout.machines]
    assert len({h.lower() for h in hosts}) == len(hosts)
    assert all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", h) and not h.isdigit() for h in hosts)
    assert hosts[1] == "a-b" and hosts[0] != "a-b" and hosts[11] == "Box" and hosts[13] == "m"
    assert hosts[9] == "m123" and hosts[10] == "m0"
    for i, line in enumerate(layout.hosts_file(0).splitlines()[2:]):  # one address, one name: no aliases
        assert line.split() == [layout.machines[i].address, hosts[i]]
    assert "#" not in layout.hosts_file(0)


@needs_testbed
def test_cli_up_hints_a_master_addr_that_resolves_for_numeric_names(tmp_path):
    from hexiscale.cli.testbed import CLI_PREFIX
    from runtime.testbed import remove_leftovers

    path = tmp_path / "num.yaml"
    path.write_text("name: num\ninter_bw_gbps: 1.25\nmachines:\n"
                    + "".join(f"  - {{name: '{i}', gpu: RTX4090, count: 1, intra_bw_gbps: 16}}\n" for i in (0, 1)))
    before = state(CLI_PREFIX)
    try:
        up = CliRunner().invoke(app, ["testbed", "up", str(path)])
        assert up.exit_code == 0, up.output
        assert "--master-addr m0`" in " ".join(up.output.split())
        done = subprocess.run(["ip", "netns", "exec", f"{CLI_PREFIX}-1-1", "getent", "hosts", "m0"],
                              capture_output=True, text=True)
        assert done.stdout.split() == ["10.77.0.1", "m0"], done
    finally:
        remove_leftovers(CLI_PREFIX)
    assert state(CLI_PREFIX) == before


def test_links_no_one_scale_can_shape_say_so_and_a_huge_scale_warns_nothing():
    """A rack at 10 GB/s and a link at 0.0001 GB/s: 100,000× apart, past the 58,000× from 1 Mbit/s to
    58 Gbit/s, so no scale fits, with or without --scale; --scale 1e308 is refused without numpy warnings."""
    import warnings

    from planner.hardware import Rack

    wide = Cluster(machines=[Machine(name=f"n{i}", gpu="RTX4090", count=1, intra_bw_gbps=16) for i in range(4)],
                   inter_bw_gbps=1.25, racks=[Rack(name="r0", machines=["n0", "n1"], bw_gbps=10)],
                   links=[Link(a="n0", b="n2", bw_gbps=0.0001)])
    for scale in (None, 1.0):
        with pytest.raises(ValueError, match=r"ratio of 100,000.*no scale fits: bring the file's links closer") as exc:
            plan_layout(wide, "hxtbx", scale=scale)
        assert "larger scale" not in str(exc.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="above 58000 Mbit/s"):
            plan_layout(load_cluster("tiny-4"), "hxtbx", scale=1e308)
    result = CliRunner().invoke(app, ["testbed", "up", "tiny-4", "--scale", "1e308"])
    assert result.exit_code in (1, 2) and "RuntimeWarning" not in result.output
