"""`hexiscale profile`: measure this machine's devices and links, write a cluster file (docs/calibration.md §9)."""

from __future__ import annotations

import math
import re
import shutil
import socket
import tempfile
from pathlib import Path

import typer
import yaml
from pydantic import TypeAdapter, ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hexiscale.cli.app import STATISTIC_HELP, app, checked_statistic, console, fail, friendly_errors, writable_file
from planner.calibration import BandwidthError, CalibrationError
from planner.io import load_cluster, load_model, load_problem
from runtime.host import shared_cores_note, too_many_ranks
from runtime.kinds import RUNTIME_KINDS
from planner.base import FROM_FILE, Name, plural, write_atomically

EXIT_PROFILE_FAILED = 1
HONESTY = ("one host: 'inter' links join processes of simulated machines; on CPU every pair of processes "
           "talks over gloo's TCP loopback, so both classes measure the same path")
TESTBED_NOTE = ("emulated cluster: 'inter' links are the testbed's shaped links between network namespaces "
                "(the cluster file's rates × its scale), 'intra' each namespace's loopback; all ranks share "
                "this host's cores")


def shapes_source(problem: str | None, model: str | None, seq_len: int | None, micro_batch: int | None):
    """(model, seq_len, micro_batch) whose shapes are timed: the problem's, else the model's."""
    if problem and model:
        fail("--problem and --model: give one (the problem names its model)")
    if problem:
        prob = load_problem(problem)
        return prob.model, seq_len or prob.training.seq_len, micro_batch or prob.training.micro_batch
    return load_model(model or "tiny"), seq_len or 128, micro_batch or 1


def split_processes(processes: int, machines: int) -> tuple[int, ...]:
    """`processes` over `machines` as evenly as they go, the first machines one more: 3 over 2
    is (2, 1), the split of docs/calibration.md's cross-machine figures (an inter link between
    machines of unlike sizes, and an intra class that still has a pair)."""
    if processes < machines:
        fail(f"--machines: {processes} processes cannot fill {plural(machines, 'machine')} (each needs one)")
    base, extra = divmod(processes, machines)
    return tuple(base + 1 if i < extra else base for i in range(machines))


def gpu_type_name(device: str, name: str | None) -> str:
    if name:
        return name
    if device == "cpu":
        return "cpu"
    import torch  # only for the device's name

    return re.sub(r"[^A-Za-z0-9._-]+", "-", torch.cuda.get_device_name(0)).strip("-")


def check_device(device: str, processes: int) -> None:
    if device not in ("cpu", "cuda"):
        fail(f"--device must be cpu or cuda, got {device!r}")
    if device == "cpu" and (why := too_many_ranks(processes)) is not None:
        fail(f"--processes: {why}")
    if device == "cuda":
        import torch  # only for this check: the CLI starts without torch

        if not torch.cuda.is_available():
            fail("--device cuda: this machine has no CUDA device")
        if torch.cuda.device_count() < processes:
            fail(f"--processes {processes}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def measure(spec, folder: Path, testbed=None):
    """The profile's processes here, or (`testbed`: a cluster) inside its emulated machines."""
    from runtime.profiling.launcher import launch_profile  # starts processes: only when profiling

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("profiling", total=None)

        def update(event: dict) -> None:
            bar.update(task, completed=event["done"], total=event["total"], description=event["what"])

        try:
            if testbed is None:
                return launch_profile(spec, folder, update)
            return measure_on_testbed(spec, folder, testbed, update)
        except typer.Exit:  # a RuntimeError too: one already printed (measure_on_testbed) goes on as it is
            raise
        except RuntimeError as exc:
            fail(str(exc), EXIT_PROFILE_FAILED)


def checked_testbed(testbed: str, machines: int):
    """The --testbed cluster, refused (one line, exit 2) before anything is built where the
    profile's machines do not fit it or no scale can emulate its links."""
    from runtime.testbed import plan_layout

    cluster = load_cluster(testbed)
    if machines > len(cluster.machines):
        fail(f"--testbed: the profile's {plural(machines, 'machine')} (--machines) do not fit the testbed's "
             f"{len(cluster.machines)}")
    try:
        plan_layout(cluster, "hxtbcheck")
    except ValueError as exc:
        fail(f"--testbed: {testbed}: {exc}")
    return cluster


def measure_on_testbed(spec, folder: Path, cluster, update):
    """Bring the emulated cluster up (one line and exit 1 where this host cannot), profile
    across its first machines, tear it down."""
    from runtime.profiling.testbed import profile_on_testbed
    from runtime.testbed import Testbed, TestbedError

    try:
        with Testbed(cluster) as bed:
            console.print(f"on the emulated cluster {cluster.name}: machines "
                          + ", ".join(f"{m.name} ({m.address}, link {m.link_mbit:,.0f} Mbit/s)"
                                      for m in bed.layout.machines[:len(spec.machines)])
                          + f"; rates = the file's × {bed.layout.scale:.4g}", highlight=False, soft_wrap=True)
            return profile_on_testbed(bed, spec, folder, update)
    except (TestbedError, ValueError) as exc:
        fail(f"--testbed: {exc}", EXIT_PROFILE_FAILED)


def checked_timeout(value: float) -> float:
    """--timeout from 1 s to a day, finite: inf had started the processes, which then failed."""
    if not (math.isfinite(value) and 1 <= value <= 86400):
        fail(f"--timeout: expected seconds from 1 to 86400 (a day), got {value:g}")
    return value


@app.command()
@friendly_errors
def profile(output: Path = typer.Option(..., "-o", "--output", help="cluster file (YAML) to write"),
            device: str = typer.Option("cpu", help="cpu (gloo processes) | cuda (NCCL, one GPU per process)"),
            processes: int = typer.Option(2, min=2, help="processes (devices) to measure at once"),
            machines: int = typer.Option(1, min=1, help="simulated machines the processes split into (as evenly as they go, the first ones one more)"),
            problem: str = typer.Option(None, help="take the GEMM shapes from this problem's model and training"),
            model: str = typer.Option(None, help="take the shapes from this model (default: tiny)"),
            seq_len: int = typer.Option(None, min=1, help="tokens per sequence (default: the problem's, or 128)"),
            micro_batch: int = typer.Option(None, min=1, help="sequences per micro-batch (default: the problem's, or 1)"),
            max_bytes: int = typer.Option(1 << 28, min=8, help="largest message, bytes (sizes from 2^10 double up to it)"),
            repeats: int = typer.Option(15, min=1, help="timed repetitions of each measurement"),
            warmup: int = typer.Option(2, min=0, help="untimed repetitions first"),
            rounds: int = typer.Option(4, min=1, help="rounds the model pass is timed in, spread over the profile "
                                       "(their mean prices η; their spread shows the machine's drift)"),
            name: str = typer.Option(None, help="cluster name (default: profiled-HOST)"),
            gpu_name: str = typer.Option(None, help="GPU type name (default: cpu, or the CUDA device's name)"),
            statistic: str = typer.Option("mean", help=STATISTIC_HELP),
            plans: str = typer.Option("layered", "--for", help="the kind of plans the cluster is for: layered (the "
                                      "all-reduce fit is written) | sequence (the all-to-all fit)"),
            timeout: float = typer.Option(120.0, callback=checked_timeout,
                                          help="seconds any process waits on a peer (1 to 86,400)"),
            testbed: str = typer.Option(None, help="cluster file or bundled name: profile across its machines, "
                                        "emulated on this host (network namespaces, shaped links; root: "
                                        "docs/testbed.md); --machines of them are used")) -> None:
    """Measure achieved FLOP/s, attention time and link times here; write them as a cluster file."""
    from runtime.profiling.launcher import ProfileSpec

    writable_file(output, "--output")
    checked_statistic(statistic)
    if plans not in RUNTIME_KINDS:
        fail(f"--for must be {' or '.join(RUNTIME_KINDS)}, got {plans!r}")
    if max_bytes < 2 * 1024:
        fail(f"--max-bytes: {max_bytes} leaves fewer than two message sizes from 1024 B (a fit needs two)")
    check_device(device, processes)
    checked_names(name, gpu_name)
    spec_model, seq, micro = shapes_source(problem, model, seq_len, micro_batch)
    try:
        spec = ProfileSpec(device=device, machines=split_processes(processes, machines), model=spec_model,
                           seq_len=seq, micro_batch=micro, max_bytes=max_bytes, repeats=repeats, warmup=warmup,
                           rounds=rounds, timeout_s=timeout)
    except ValidationError as exc:
        fail("; ".join(f"--{str(e['loc'][0]).replace('_', '-') if e['loc'] else 'settings'}: {e['msg']}"
                       for e in exc.errors()))
    cluster = checked_testbed(testbed, machines) if testbed else None
    console.print(f"profiling {processes} {device} processes on {machines} simulated machine(s), shapes of model "
                  f"{spec_model.name} (seq {seq}, micro-batch {micro}), messages {spec.min_bytes}…{spec.max_bytes} B",
                  highlight=False, soft_wrap=True)
    folder = Path(tempfile.mkdtemp(prefix="hexiscale-profile-"))  # after every check: a refusal leaves none
    try:
        result = measure(spec, folder, cluster) if testbed else measure(spec, folder)
    except KeyboardInterrupt:
        shutil.rmtree(folder, ignore_errors=True)  # a Ctrl-C left its rank logs and spec behind
        raise
    write_profile(result, output, name or f"profiled-{socket.gethostname()}", gpu_type_name(device, gpu_name),
                  statistic, plans, raw=folder / "profile.json", honesty=TESTBED_NOTE if testbed else HONESTY)
    shutil.rmtree(folder, ignore_errors=True)  # written: the raw measurements are kept only when a failure names them


def checked_names(name: str | None, gpu_name: str | None) -> None:
    """--name and --gpu-name follow the cluster file's name rules, checked before the
    measuring (the file written at its end would have refused them)."""
    for option, value in (("--name", name), ("--gpu-name", gpu_name)):
        if value is not None:
            try:
                TypeAdapter(Name).validate_python(value, context=FROM_FILE)
            except ValidationError as exc:
                fail(f"{option}: {exc.errors()[0]['msg']} (got {value!r})")


def _larger_messages_hint(result, exc: Exception) -> str:
    """A bandwidth fit that failed on messages cut short of the default: say how to help it."""
    from runtime.profiling.launcher import ProfileSpec

    default = ProfileSpec.model_fields["max_bytes"].default
    if not isinstance(exc, BandwidthError) or result.spec.max_bytes >= default:
        return ""
    return (f"; the messages went up to {result.spec.max_bytes} B only: a larger --max-bytes (default {default}) "
            f"lets the transfer show past the latency")


def write_profile(result, output: Path, name: str, gpu_name: str, statistic: str = "mean",
                  plans: str = "layered", raw: Path | None = None, honesty: str = HONESTY) -> None:
    """Fit, show and write; a figure outside physical sense, or one the measurements do not
    determine, is refused and nothing is written (`raw`: where the measurements stay)."""
    from runtime.profiling.fit import profiled_cluster

    try:
        cluster, reports, notes = profiled_cluster(result, name=name, gpu_name=gpu_name, what=str(output),
                                                   statistic=statistic, plans=plans)
    except (CalibrationError, ValueError) as exc:
        kept = f" (the raw measurements are in {raw})" if raw else ""
        fail(f"{exc}; {output} not written{kept}{_larger_messages_hint(result, exc)}")
    console.print(compute_table(result, cluster.catalog[gpu_name]))
    console.print(links_table(reports))
    cpu = result.spec.device == "cpu"
    shared = shared_cores_note(result.spec.processes, result.spec.threads) if cpu else ""
    for note in [*notes, honesty if cpu else "", shared]:
        if note:
            console.print(f"note: {note}", highlight=False, soft_wrap=True)
    console.print(f"repeatability: compute (max − min)/median {result.compute_spread:.1%} (median over the "
                  f"measurements); links: the mean's standard error over the mean "
                  + ", ".join(f"{c} {r.mean_error:.1%}" for c, r in reports.items()) + " (median over the measurements)",
                  highlight=False)
    console.print(drift_line(result), highlight=False, soft_wrap=True)
    header = (f"# Measured by `hexiscale profile` on {result.host}: {result.spec.processes} {result.spec.device} "
              f"processes, {len(result.spec.machines)} simulated machine(s); links: the "
              f"{RUNTIME_KINDS[plans].profiled_op} fit, for {plans} plans.\n"
              f"# {honesty if result.spec.device == 'cpu' else ''}\n")
    write_atomically(output, header + yaml.safe_dump(cluster.model_dump(mode="json", exclude_defaults=True),
                                                     sort_keys=False))
    raw = output.with_suffix(".profile.json")
    write_atomically(raw, result.model_dump_json(indent=1))
    console.print(f"wrote {output} (raw measurements: {raw})", highlight=False)


def drift_line(result) -> str:
    """The model pass's rounds: how steady the machine was while profiled, and a warning past
    DRIFT_WARNING (every run predicted from this file carries that uncertainty)."""
    from runtime.profiling.fit import DRIFT_WARNING, drift

    if len(result.model_rounds) < 2:
        return "drift: not known (the model pass was timed in one round: --rounds 1)"
    spread = drift(result)
    line = (f"drift: the model pass's {len(result.model_rounds)} rounds took "
            + ", ".join(f"{r * 1e3:.1f}" for r in result.model_rounds)
            + f" ms (spread {spread:.0%} of their mean; η is priced by their mean)")
    if spread > DRIFT_WARNING:
        line += (f"\nwarning: the machine's speed moved by {spread:.0%} while it was profiled (more than "
                 f"{DRIFT_WARNING:.0%}): predictions from this file carry that uncertainty; profile again "
                 f"when the machine is quiet, or calibrate from runs")
    return line


def compute_table(result, gpu) -> Table:
    table = Table(title=f"compute per process ({gpu.name}: peak {gpu.peak_tflops * 1e3:.2f} GFLOP/s measured, "
                        f"η {gpu.efficiency:.3f} on the model)")
    for column in ("what", "shape", "ms", "GFLOP/s"):
        table.add_column(column, justify="right")
    for g in (result.square_gemm, *result.gemms):
        table.add_row("GEMM fwd+bwd", f"{g.tokens}×{g.fan_in}×{g.fan_out}", f"{g.seconds * 1e3:.3f}",
                      f"{g.flops_per_s / 1e9:.2f}")
    table.add_row("model fwd+bwd", f"{result.spec.micro_batch}×{result.spec.seq_len} tokens",
                  f"{result.model.seconds * 1e3:.3f}", f"{result.model_flops / result.model.seconds / 1e9:.2f}")
    for a in result.attention:
        table.add_row("attention fwd+bwd", f"seq {a.seq_len}", f"{a.seconds * 1e3:.3f}", "")
    return table


def links_table(reports: dict) -> Table:
    written = next(iter(reports.values())).written_op
    table = Table(title=f"links: x/bw + α (cluster figure = the {written} fit; collectives timed after "
                        f"compute, as a run meets them)")
    for column in ("class", "fit", "bw GB/s", "α µs", "rms rel. error", "points"):
        table.add_column(column, justify="right")
    for link_class, report in reports.items():
        for label, fit in report.per_op.items():
            label = f"{label} (written)" if label == written else label
            if isinstance(fit, str):  # that operation's own fit was refused: say why
                table.add_row(link_class, label, "—", "—", fit.split(": ")[-1], "")
                continue
            alpha = "0 (α ≥ 0)" if fit.latency_at_zero else f"{fit.latency_us:.1f}"  # the free fit's was < 0
            table.add_row(link_class, label, f"{fit.bw_gbps:.3f}", alpha, f"{fit.rms_rel_error:.1%}", str(fit.points))
        for op, (bw, nbytes) in report.direct.items():
            table.add_row(link_class, f"direct {op} {nbytes} B", f"{bw:.3f}", "", "", "1")
        for op, alpha_us in report.direct_latency_us.items():
            table.add_row(link_class, f"direct {op} 4 B", "", f"{alpha_us:.1f}", "", "1")
    return table
