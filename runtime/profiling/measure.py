"""The measuring processes of `hexiscale profile`: `python -m runtime.profiling.measure SPEC.json RANK`.

Every rank measures at once, so the figures hold the contention a run of that many processes
has (on CPU, processes share the cores). Each figure keeps the mean, median and fastest of
`repeats` timed repetitions after `warmup` untimed ones; on CUDA each timing waits for the device.

Compute: the model's GEMM shapes (forward and both backward GEMMs, at TP size 1), a large
square GEMM (the type's best rate: its measured peak), the whole model's forward + backward
per micro-batch as the runtime runs it (the achieved rate η·peak the cost model uses; timed
in rounds spread over the whole profile, `ModelPass`), and causal attention against
sequence length. Links: per class — inside a machine (the first machine's ranks), between
machines (the first rank of each machine) — p2p (half a ping-pong), all-reduce and
all-to-all over message sizes, each after the compute a run does between two collectives
(`compute_gap`), averaged over the ranks that time it, while every other rank runs that
compute too (`keep_busy`). Every exchange goes through the communicator. On one host
there is no network: "between machines" means processes of two simulated machines, and on
CPU every pair talks over gloo's TCP loopback, so the two classes measure the same path.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from planner import cost
from planner.layered.cost import tp_rounds
from runtime.communication.communicator import Communicator, Group, RankPlace
from runtime.layered.layout import StageRanks
from runtime.layered.stage import StageModel
from runtime.model.llama import causal_attention
from runtime.profiling.fit import pass_flops
from runtime.profiling.launcher import (AttentionTiming, GemmTiming, LinkTiming, ProfileResult, ProfileSpec,
                                    Repeated)
from runtime.metrics.timing import device_synchronizer
from runtime.launch.worker import die_with_parent

SQUARE = 512  # the square GEMM's side: at its best rate on a CPU core, and short


class Meter:
    """Times callables on this rank: warm-up, then timed repetitions; tallies the spreads."""

    def __init__(self, spec: ProfileSpec, device: torch.device):
        self.spec, self.sync, self.spreads = spec, device_synchronizer(device), []

    def samples(self, fn: Callable[[], object], before: Callable[[], object] | None = None,
                repeats: int | None = None) -> list[float]:
        for _ in range(self.spec.warmup):
            fn()
        times = []
        for _ in range(repeats or self.spec.repeats):
            if before is not None:
                before()
            if self.sync:
                self.sync()
            start = time.perf_counter()
            fn()
            if self.sync:
                self.sync()
            times.append(time.perf_counter() - start)
        return times

    def measure(self, fn: Callable[[], object], scale: float = 1.0, repeats: int | None = None) -> list[float]:
        """The timed repetitions (each times `scale`), their spread tallied."""
        times = [t * scale for t in self.samples(fn, repeats=repeats)]
        self.spreads.append((max(times) - min(times)) / statistics.median(times))
        return times


def gemm_shapes(spec: ProfileSpec) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of each distinct weight matrix of the model."""
    m = spec.model
    shapes = [(m.hidden, m.heads * m.head_dim), (m.hidden, m.num_kv_heads * m.head_dim),
              (m.heads * m.head_dim, m.hidden), (m.hidden, m.ffn_hidden), (m.ffn_hidden, m.hidden),
              (m.hidden, m.vocab)]
    return list(dict.fromkeys(shapes))


def time_gemm(meter: Meter, device, tokens: int, fan_in: int, fan_out: int) -> GemmTiming:
    x, w = torch.randn(tokens, fan_in, device=device), torch.randn(fan_out, fan_in, device=device)
    g = torch.randn(tokens, fan_out, device=device)
    return GemmTiming.of(meter.measure(lambda: (x @ w.T, g @ w, g.T @ x)), tokens=tokens, fan_in=fan_in,
                         fan_out=fan_out)


class ModelPass:
    """The whole model as a run executes it — the runtime's own stage holding every layer —
    forward + backward per micro-batch, `spec.accumulate` micro-batches accumulating their
    gradients as a step's do (the adds are part of what training achieves).

    Timed in `spec.rounds` rounds spread over the profile (`round_points`): on shared cores a
    machine's speed drifts by tens of percent within a minute (two profiles of cluster A two
    minutes apart: 104 and 130 ms), so one burst of repetitions prices every later run by one
    moment; the rounds' mean prices them by the profile's whole span, and their spread says
    how far the machine drifted (`profiling.fit.drift`)."""

    def __init__(self, spec: ProfileSpec, device):
        whole = StageRanks(pipeline=0, stage=0, ranks=(0,), devices=(0,), layer_start=0,
                           layer_end=spec.model.layers, first=True, last=True)
        self.spec = spec
        self.model = StageModel(spec.model, whole, 0, None, spec.seq_len, seed=0).to(device)
        self.tokens = torch.randint(0, spec.model.vocab, (spec.micro_batch, spec.seq_len), device=device)
        self.rounds: list[list[float]] = []

    def step(self) -> None:
        self.model.zero_grad(set_to_none=True)
        for _ in range(self.spec.accumulate):
            self.model(self.tokens, self.tokens, 1.0 / self.tokens.numel()).backward()

    def time_round(self, meter: Meter, comm: Communicator, progress: Progress) -> None:
        """One round's repetitions (per micro-batch), every rank computing at once."""
        comm.barrier()  # the contention of a run: no rank is idle meanwhile
        repeats = max(1, math.ceil(self.spec.repeats / self.spec.rounds))
        self.rounds.append(meter.measure(self.step, scale=1.0 / self.spec.accumulate, repeats=repeats))
        progress.tick(f"model forward + backward, round {len(self.rounds)} of {self.spec.rounds}")

    def result(self) -> dict:
        times = [t for round_ in self.rounds for t in round_]
        return {"model": Repeated.of(times), "model_rounds": tuple(statistics.fmean(r) for r in self.rounds)}


def round_points(measurements: int, rounds: int) -> list[int]:
    """After which link measurement (0-based) each of the model pass's later rounds runs: the
    first round runs before the links, the other `rounds` − 1 evenly among them, the last
    after the last measurement (an index twice: two rounds there)."""
    return [max(0, math.ceil(j * measurements / (rounds - 1)) - 1) for j in range(1, rounds)]


def attention_timings(meter: Meter, spec: ProfileSpec, device) -> list[AttentionTiming]:
    m, out = spec.model, []
    for seq_len in sorted({max(16, spec.seq_len // 4), max(16, spec.seq_len // 2), spec.seq_len, 2 * spec.seq_len}):
        q = torch.randn(spec.micro_batch, seq_len, m.heads, m.head_dim, device=device, requires_grad=True)
        kv = [torch.randn(spec.micro_batch, seq_len, m.num_kv_heads, m.head_dim, device=device, requires_grad=True)
              for _ in range(2)]
        times = meter.measure(lambda: causal_attention(q, *kv).sum().backward())
        out.append(AttentionTiming(seq_len=seq_len, seconds=statistics.median(times)))
    return out


class Progress:
    """Rank 0 appends one JSON line per finished measurement to the progress file."""

    def __init__(self, spec: ProfileSpec, rank: int, total: int):
        self.path, self.total, self.done = Path(spec.progress) if rank == 0 and spec.progress else None, total, 0

    def tick(self, what: str) -> None:
        self.done += 1
        if self.path is not None:
            with self.path.open("a") as handle:
                handle.write(json.dumps({"done": self.done, "total": self.total, "what": what}) + "\n")


def link_groups(spec: ProfileSpec, comm: Communicator) -> dict[str, Group]:
    """The measured group of each class that has two ranks; every rank creates every group."""
    starts = [sum(spec.machines[:i]) for i in range(len(spec.machines))]
    found = {}
    if spec.machines[0] >= 2:
        found["intra"] = comm.new_group(tuple(range(spec.machines[0])))
    if len(spec.machines) >= 2:
        found["inter"] = comm.new_group(tuple(starts))
    return found


def compute_gap(spec: ProfileSpec, group_size: int, device) -> Callable[[], object]:
    """The compute a run does between two of its collectives, as one GEMM of the model's width:
    the cost model's forward + backward of one layer (c·b·s·F_layer) at TP size `group_size`,
    shared among the layer's r all-reduces. Timing each exchange after it, as a TP run meets
    it, keeps what back-to-back repetitions hide: the ranks' skew at the sync point (it grows
    with the compute before it) and the wake-up of a process that was computing."""
    training, tokens = spec.training(), spec.micro_batch * spec.seq_len
    flops = (cost.pass_multiplier(training) * tokens * cost.layer_flops_per_token(spec.model, training.seq_len)
             / (group_size * tp_rounds(training)))
    width = max(1, round(flops / (2 * tokens * spec.model.hidden)))
    x, w = torch.randn(tokens, spec.model.hidden, device=device), torch.randn(spec.model.hidden, width, device=device)
    return lambda: x @ w


def link_repeats(spec: ProfileSpec, nbytes: int) -> int:
    """Repetitions of one link measurement: up to 8× `repeats` for messages under 1 MiB, whose
    times (mostly α: wake-ups, skew) scatter most and cost least. Every rank computes the
    same count from the size alone, so the collectives line up."""
    return spec.repeats * max(1, min(SMALL_MESSAGE_BOOST, (1 << 20) // nbytes))


SMALL_MESSAGE_BOOST = 8


def added_seconds(meter: Meter, fn: Callable[[], object], gap: Callable[[], object], repeats: int) -> list[float]:
    """Each repetition's time of the compute gap then `fn`, less the gap's own mean time when
    run alone: what the exchange adds to a run, the compute it slows included (on shared
    cores a GEMM next to collectives runs markedly slower than one next to GEMMs)."""
    alone = statistics.fmean(meter.samples(gap, repeats=repeats))
    return [t - alone for t in meter.samples(lambda: (gap(), fn()), repeats=repeats)]


def one_way_seconds(meter: Meter, comm: Communicator, pair: tuple[int, int], buffer: torch.Tensor,
                    gap: Callable[[], object], repeats: int) -> list[float]:
    """Half of what each ping-pong round trip between the pair adds after the compute gap on
    both ranks (rank pair[0] times it)."""
    a, b = pair

    def ping_pong() -> None:
        if comm.rank == a:
            comm.send(buffer, b, 0).wait()
            comm.recv(buffer, b, 1)
        elif comm.rank == b:
            comm.recv(buffer, a, 0)
            comm.send(buffer, a, 1).wait()

    return [t / 2 for t in added_seconds(meter, ping_pong, gap, repeats)]


def collective_seconds(meter: Meter, comm: Communicator, op: str, group: Group, buffer: torch.Tensor,
                       gap: Callable[[], object], repeats: int) -> list[float]:
    """What each collective adds on this rank, from its arrival after the compute gap."""
    n = group.size
    split = [buffer.numel() // n] * n
    even = buffer[: sum(split)]  # each peer gets an equal block
    run = {"all_reduce": lambda: comm.all_reduce(buffer, group),
           "all_to_all": lambda: comm.all_to_all(even, send_sizes=split, recv_sizes=split, group=group)}[op]
    return added_seconds(meter, run, gap, repeats)


def keep_busy(meter: Meter, gap: Callable[[], object], repeats: int) -> None:
    """A rank outside the measured exchange computes as long as the timing ranks do: in a run
    every process works, and where processes share cores (2 per core) an exchange waits for
    the peers the scheduler has set aside — which idle bystanders would hide."""
    for _ in range(2):  # the timers' gap alone, then gap + exchange
        meter.samples(gap, repeats=repeats)


def mean_of_timers(comm: Communicator, times: list[float] | None, timers: int, repeats: int,
                   device) -> list[float]:
    """Each repetition's time averaged over the ranks that timed it (`times` None elsewhere).
    At a sync point the rank that arrives last waits least; the mean over the ranks is what
    the exchange adds to a run's mean rank, skew included."""
    own = times if times is not None else [0.0] * repeats
    values = torch.tensor(own, dtype=torch.float64, device=device)
    return (comm.all_reduce(values, comm.world, "sum") / timers).cpu().tolist()


def measure_link(meter: Meter, comm: Communicator, spec: ProfileSpec, link_class: str, group: Group,
                 op: str, nbytes: int, device) -> LinkTiming:
    buffer = torch.ones(nbytes // 4, device=device)
    inside = comm.rank in group.ranks
    gap, repeats = compute_gap(spec, group.size, device), link_repeats(spec, nbytes)
    if op == "p2p":
        pair = group.ranks[:2]
        inside = comm.rank in pair
        times = one_way_seconds(meter, comm, pair, buffer, gap, repeats) if inside else None
        times = times if comm.rank == pair[0] else None
        timers = 1
    else:
        times = collective_seconds(meter, comm, op, group, buffer, gap, repeats) if inside else None
        timers = group.size
    if not inside:
        keep_busy(meter, gap, repeats)
    times = mean_of_timers(comm, times, timers, repeats, device)
    return LinkTiming.of(times, link_class=link_class, op=op, ranks=2 if op == "p2p" else group.size, nbytes=nbytes)


LINK_OPS = ("p2p", "all_reduce", "all_to_all")  # measured per link class, each over every message size


def link_measurements(spec: ProfileSpec, comm: Communicator) -> list[tuple[str, Group, str, int]]:
    """(class, group, operation, bytes) of every link measurement, in the order they run."""
    return [(link_class, group, op, nbytes) for link_class, group in link_groups(spec, comm).items()
            for op in LINK_OPS for nbytes in spec.message_sizes()]


def measure_links(meter: Meter, comm: Communicator, spec: ProfileSpec, progress: Progress, device,
                  timed_pass: ModelPass) -> list[LinkTiming]:
    """Every link measurement, with the model pass's later rounds among them (all at the end
    when there is no link to measure: one process)."""
    measurements, out = link_measurements(spec, comm), []
    points = round_points(len(measurements), spec.rounds)
    for i, (link_class, group, op, nbytes) in enumerate(measurements):
        out.append(measure_link(meter, comm, spec, link_class, group, op, nbytes, device))
        progress.tick(f"{link_class} {op} {nbytes} B")
        for _ in range(points.count(i)):
            timed_pass.time_round(meter, comm, progress)
    while len(timed_pass.rounds) < spec.rounds:
        timed_pass.time_round(meter, comm, progress)
    return out


SMALL_BYTES = 4  # one float: the bytes weigh nothing beside α
SMALL_OPS = ("p2p", "all_reduce")  # the operations whose α a plan pays per message


def measure_small_links(meter: Meter, comm: Communicator, spec: ProfileSpec, progress: Progress,
                        device) -> list[LinkTiming]:
    """A SMALL_BYTES message of each class's SMALL_OPS, timed as every link measurement is
    (after the compute gap, the other ranks computing): its time is α by itself, measured
    directly, where the fit's α is read off the line through all sizes."""
    out = []
    for link_class, group in link_groups(spec, comm).items():
        for op in SMALL_OPS:
            out.append(measure_link(meter, comm, spec, link_class, group, op, SMALL_BYTES, device))
            progress.tick(f"{link_class} {op} {SMALL_BYTES} B (direct latency)")
    return out


def measure_compute(meter: Meter, comm: Communicator, spec: ProfileSpec, progress: Progress, device,
                    timed_pass: ModelPass) -> dict:
    """The GEMMs, the model pass's first round and attention."""
    tokens = spec.micro_batch * spec.seq_len
    comm.barrier()  # every rank computes at once: the contention of a run
    square = time_gemm(meter, device, SQUARE, SQUARE, SQUARE)
    progress.tick("square GEMM")
    gemms = []
    for fan_in, fan_out in gemm_shapes(spec):
        gemms.append(time_gemm(meter, device, tokens, fan_in, fan_out))
        progress.tick(f"GEMM {tokens}x{fan_in}x{fan_out}")
    timed_pass.time_round(meter, comm, progress)
    attention = attention_timings(meter, spec, device)
    progress.tick("attention")
    return {"square_gemm": square, "gemms": gemms, "attention": attention, "model_flops": pass_flops(spec, "layered")}


def memory_gib(spec: ProfileSpec, device) -> float:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    with open("/proc/meminfo") as info:
        total_kib = next(int(line.split()[1]) for line in info if line.startswith("MemTotal:"))
    return total_kib * 1024 / 2**30 / spec.processes


def run(spec: ProfileSpec, rank: int) -> None:
    device = torch.device("cuda", rank) if spec.device == "cuda" else torch.device("cpu")
    if spec.device == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(spec.threads)
    machine_of = [m for m, count in enumerate(spec.machines) for _ in range(count)]
    master = os.environ.get("HEXISCALE_MASTER_ADDR", "127.0.0.1")  # another machine's on the testbed
    comm = Communicator.start("nccl" if spec.device == "cuda" else "gloo", master, os.environ["HEXISCALE_PORT"],
                              rank, spec.processes, tuple(RankPlace(device=r, machine=machine_of[r])
                                                          for r in range(spec.processes)), spec.timeout_s, device)
    classes = (spec.machines[0] >= 2) + (len(spec.machines) >= 2)
    meter = Meter(spec, device)
    progress = Progress(spec, rank, 2 + spec.rounds + len(gemm_shapes(spec))
                        + classes * (len(LINK_OPS) * len(spec.message_sizes()) + len(SMALL_OPS)))
    timed_pass = ModelPass(spec, device)
    compute = measure_compute(meter, comm, spec, progress, device, timed_pass)
    links = measure_links(meter, comm, spec, progress, device, timed_pass)
    small = measure_small_links(meter, comm, spec, progress, device)
    if rank == 0:
        result = ProfileResult(spec=spec, host=socket.gethostname(), links=tuple(links), small_links=tuple(small),
                               memory_gib=memory_gib(spec, device),
                               compute_spread=statistics.median(meter.spreads), **compute,
                               **timed_pass.result())
        Path(spec.out).write_text(result.model_dump_json(indent=1))
    comm.close()


def main(argv: list[str]) -> int:
    die_with_parent()
    spec = ProfileSpec.model_validate_json(Path(argv[0]).read_text())
    run(spec, int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
