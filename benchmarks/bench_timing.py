"""Seconds of repeated calls, the one timing loop of the single-process benchmarks
(bench_ring_blocks, bench_vendor): one warm-up call, then each call timed on its own, so
that each benchmark picks the statistic it reports (the fastest, the median)."""

from __future__ import annotations

from runtime.profiling.round_trip import timed


def call_seconds(fn, repeats: int) -> list[float]:
    """The wall seconds of each of `repeats` calls of `fn`, after one untimed warm-up call."""
    return timed(fn, repeats, warmup=1)
