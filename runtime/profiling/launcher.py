"""`hexiscale profile`'s settings, raw results and launcher (no torch here).

The launcher starts one process per measured device (`python -m runtime.profiling.measure SPEC RANK`),
on this machine, and waits for them within a bound; rank 0 writes the raw measurements
(`ProfileResult`) and a progress file the caller may watch. The fit lives in
`runtime.profiling.fit`, the measuring in `runtime.profiling.measure`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field, model_validator

from planner.base import Frozen
from planner.calibration import Statistic
from planner.workload import MAX_TOKENS, ModelSpec, TrainingSpec

ProfileDevice = Literal["cpu", "cuda"]
LinkClassName = Literal["intra", "inter"]
OpName = Literal["p2p", "all_reduce", "all_to_all"]
GRACE_S = 15.0
# 16 GiB: past any link's fit (the largest default is 256 MiB); a typo of 10^15 B allocated until it failed
MAX_MESSAGE_BYTES = 1 << 34


class ProfileSpec(Frozen):
    device: ProfileDevice = Field(default="cpu", description="cpu: gloo processes; cuda: NCCL, one GPU each")
    machines: tuple[int, ...] = Field(min_length=1, description="processes per simulated machine")
    model: ModelSpec = Field(description="the model whose shapes are timed")
    seq_len: int = Field(ge=1, le=MAX_TOKENS, description="tokens per sequence of the timed shapes")
    micro_batch: int = Field(ge=1, description="sequences per micro-batch of the timed shapes")
    accumulate: int = Field(default=4, ge=1, description="micro-batches accumulating gradients in each timed model pass")
    min_bytes: int = Field(default=1 << 10, ge=4, description="smallest message, bytes")
    max_bytes: int = Field(default=1 << 28, ge=8, le=MAX_MESSAGE_BYTES, description="largest message, bytes")
    warmup: int = Field(default=2, ge=0, description="untimed repetitions before each measurement")
    repeats: int = Field(default=15, ge=1, description="timed repetitions (summarized by mean, median and fastest)")
    rounds: int = Field(default=4, ge=1, description="rounds the model pass's repetitions are split into, spread "
                        "over the profile (the first before the links, the rest among them)")
    threads: int = Field(default=1, ge=1, description="torch threads per process (a run uses 1)")
    timeout_s: float = Field(default=120.0, gt=0, le=86400, allow_inf_nan=False,
                             description="bound on any collective's wait, s (at most a day)")
    out: str = Field(default="", description="where rank 0 writes the ProfileResult JSON")
    progress: str = Field(default="", description="where rank 0 appends progress lines")

    @model_validator(mode="after")
    def _sizes(self) -> ProfileSpec:
        if self.max_bytes < 2 * self.min_bytes:
            raise ValueError(f"max_bytes {self.max_bytes} must be at least twice min_bytes {self.min_bytes} "
                             f"(a fit needs two message sizes)")
        return self

    @property
    def processes(self) -> int:
        return sum(self.machines)

    def training(self) -> TrainingSpec:
        """The training settings of the timed shapes (one micro-batch, no recompute)."""
        return TrainingSpec(seq_len=self.seq_len, global_batch=self.micro_batch, micro_batch=self.micro_batch)

    def message_sizes(self) -> list[int]:
        sizes, x = [], self.min_bytes
        while x <= self.max_bytes:
            sizes.append(x)
            x *= 2
        return sizes


class Repeated(Frozen):
    """Summaries of one measurement's timed repetitions."""

    seconds: float = Field(gt=0, description="median")
    fastest_s: float = Field(gt=0, description="the fastest repetition")
    mean_s: float = Field(gt=0, description="mean (what a sum of many such operations averages)")
    mean_error: float = Field(default=0.0, ge=0, description="the mean's standard error over the mean")

    def summary(self, statistic: Statistic) -> float:
        return {"mean": self.mean_s, "median": self.seconds, "min": self.fastest_s}[statistic]

    @classmethod
    def of(cls, times: list[float], **fields) -> Repeated:
        """From the repetitions' times; a time at or below 0 (a difference of two noisy
        times, see `runtime.profiling.measure.measure_link`) counts as MIN_SECONDS."""
        times = [max(t, MIN_SECONDS) for t in times]
        mean = statistics.fmean(times)
        error = statistics.stdev(times) / len(times) ** 0.5 / mean if len(times) > 1 else 0.0
        return cls(seconds=statistics.median(times), fastest_s=min(times), mean_s=mean, mean_error=error, **fields)


MIN_SECONDS = 1e-7  # below any operation's real cost on any device


class GemmTiming(Repeated):
    tokens: int = Field(ge=1, description="rows of the activation")
    fan_in: int = Field(ge=1, description="input features")
    fan_out: int = Field(ge=1, description="output features")

    @property
    def flops_per_s(self) -> float:
        return self.rate("median")

    def rate(self, statistic: Statistic) -> float:
        """FLOP/s of forward + both backward GEMMs."""
        return 6.0 * self.tokens * self.fan_in * self.fan_out / self.summary(statistic)


class AttentionTiming(Frozen):
    seq_len: int = Field(ge=1, description="tokens per sequence")
    seconds: float = Field(gt=0, description="causal attention forward + backward of one micro-batch, median")


class LinkTiming(Repeated):
    link_class: LinkClassName = Field(description="intra: inside a machine; inter: between machines")
    op: OpName = Field(description="p2p (one way, from a ping-pong), all_reduce or all_to_all")
    ranks: int = Field(ge=2, description="processes taking part")
    nbytes: int = Field(ge=1, description="message bytes (all-to-all: each rank's whole buffer)")


class ProfileResult(Frozen):
    spec: ProfileSpec
    host: str = Field(description="where it ran")
    square_gemm: GemmTiming = Field(description="a large square GEMM: the device's best rate")
    gemms: tuple[GemmTiming, ...] = Field(description="the model's GEMM shapes (TP size 1)")
    model: Repeated = Field(description="the whole model's forward + backward per micro-batch, every round's "
                            "repetitions together")
    model_rounds: tuple[float, ...] = Field(default=(), description="each round's mean seconds of that pass, in "
                                            "order: how far the machine's speed drifted over the profile")
    model_flops: float = Field(gt=0, description="§3's FLOPs of that forward + backward (a sequence "
                               "cluster recounts them by §7.2: profiling.fit.pass_flops)")
    attention: tuple[AttentionTiming, ...] = Field(description="attention time against sequence length")
    links: tuple[LinkTiming, ...] = Field(description="every link measurement")
    small_links: tuple[LinkTiming, ...] = Field(default=(), description="a 4-byte message of each class's p2p and "
                                                "all-reduce, timed like the others but in no fit: the direct "
                                                "latency each fitted α is held against")
    memory_gib: float = Field(gt=0, description="memory per device, GiB")
    compute_spread: float = Field(ge=0, description="median (max − min)/median of the compute timings")


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


# start(rank, argv, env, log file) -> the rank's process: where and how each rank runs
Starter = Callable[[int, list[str], dict, object], subprocess.Popen]


def local_start(rank: int, argv: list[str], env: dict, log) -> subprocess.Popen:
    """A rank as a child process on this machine."""
    return subprocess.Popen(argv, env=env, cwd=repo_root(), stdout=log, stderr=subprocess.STDOUT)


def launch_profile(spec: ProfileSpec, folder: Path, on_progress: Callable[[dict], None] | None = None,
                   start: Starter = local_start, master: str = "127.0.0.1") -> ProfileResult:
    """Run the measurement processes (`start`: each rank's process, by default here; `master`:
    the address rank 0's store listens on, as the other ranks reach it); returns rank 0's
    result or raises RuntimeError with the first failing rank's last error line."""
    from runtime.launch.launcher import free_port  # the run launcher's port picker (no torch)

    folder.mkdir(parents=True, exist_ok=True)
    spec = spec.model_copy(update={"out": str(folder / "profile.json"), "progress": str(folder / "progress.jsonl")})
    Path(spec.progress).write_text("")
    (folder / "spec.json").write_text(spec.model_dump_json())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo_root()), os.environ.get("PYTHONPATH", "")]),
           "HEXISCALE_PORT": str(free_port()), "HEXISCALE_MASTER_ADDR": master,
           "LOCAL_WORLD_SIZE": str(spec.processes)}  # every rank on this host's cores
    procs = []
    for rank in range(spec.processes):
        with (folder / f"rank{rank}.log").open("w") as log:
            argv = [sys.executable, "-m", "runtime.profiling.measure", str(folder / "spec.json"), str(rank)]
            procs.append(start(rank, argv, dict(env), log))
    _wait(procs, spec, on_progress)
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        lines = (folder / f"rank{failed[0]}.log").read_text().strip().splitlines()
        raise RuntimeError(f"profile rank {failed[0]} failed: {lines[-1] if lines else 'no output'} "
                           f"(logs in {folder})")
    return ProfileResult.model_validate_json(Path(spec.out).read_text())


def _wait(procs: list[subprocess.Popen], spec: ProfileSpec, on_progress) -> None:
    """Poll the children and the progress file; after a failure give the rest the timeout
    plus a grace period, then kill them."""
    seen, deadline = 0, None
    while any(p.poll() is None for p in procs):
        lines = Path(spec.progress).read_text().splitlines()
        for line in lines[seen:]:
            if on_progress is not None and line.strip():
                on_progress(json.loads(line))
        seen = len(lines)
        if deadline is None and any(p.returncode not in (None, 0) for p in procs):
            deadline = time.monotonic() + spec.timeout_s + GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)
    lines = Path(spec.progress).read_text().splitlines()
    for line in lines[seen:]:
        if on_progress is not None and line.strip():
            on_progress(json.loads(line))
