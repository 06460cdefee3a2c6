"""Seconds of repeated calls, the one timing loop of the single-process benchmarks
(bench_ring_blocks, bench_vendor): one warm-up call, then each call timed on its own, so
that each benchmark picks the statistic it reports (the fastest, the median)."""

from __future__ import annotations

import time


def call_seconds(fn, repeats: int) -> list[float]:
    """The wall seconds of each of `repeats` calls of `fn`, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times
