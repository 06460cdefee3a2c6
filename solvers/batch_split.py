"""The least max over D of base_p + m_p·step_p with Σ m_p fixed: micro-batches handed out one
at a time, each where the next value is least (the heap's answer, exact for this min–max),
without the heap's loop. Shared by both plan kinds: a layered plan's pipelines (T_pipe is
bubble + (m − 1)·period) and a sequence plan's replicas (m·T_mb)."""

from __future__ import annotations

import heapq

import numpy as np


def greedy_increments(base: np.ndarray, step: np.ndarray, extra: int) -> np.ndarray:
    """Hand out `extra` micro-batches one at a time, each to the pipeline p whose next value
    base[p] + k·step[p] (k: its count so far plus one) is least, ties to the lower p — the
    heap's answer: the `extra` first of all the values in the order (value, p). Found without
    the heap's O(extra·log D) loop: from the water level where the counts sum to `extra`
    (`_corrected_at_level`), or by bisection on the value of the last one handed out."""
    base, step = np.asarray(base, dtype=float), np.asarray(step, dtype=float)
    if extra <= 0:
        return np.zeros(len(base), dtype=np.int64)
    if np.any(base + step < 0) or np.any(step < 0):
        raise ValueError("pipeline times must not fall with more micro-batches")
    if len(base) <= HEAP_CORRECTION_PIPELINES and np.all(step > 0):
        return _corrected_at_level(base, step, extra, _water_level(base, step, extra))
    return _bisected(base, step, extra)


# Up to this many pipelines the counts at the water level are corrected by a heap (at most
# about one step per pipeline); above, by bisection, whose 64 vector rounds cost less there.
HEAP_CORRECTION_PIPELINES = 512


def _water_level(base: np.ndarray, step: np.ndarray, extra: int) -> float:
    """The v where Σ_p max(0, (v − base_p)/step_p) = extra (steps > 0): the counts' continuous
    solution, whose floors sum to within D of `extra`. The pipelines under the level are a
    prefix of them by base: each that joins lowers the level, never below its own base."""
    order = np.argsort(base, kind="stable")
    inverse = 1.0 / step[order]
    sum_base, sum_inverse, level = 0.0, 0.0, -np.inf
    for i, p in enumerate(order):
        if base[p] >= level and i:
            break
        sum_base += base[p] * inverse[i]
        sum_inverse += inverse[i]
        level = (extra + sum_base) / sum_inverse
    return float(level)


def _corrected_at_level(base: np.ndarray, step: np.ndarray, extra: int, level: float) -> np.ndarray:
    """Every value at or below `level` taken (a prefix of the order (value, p)), then the next
    values added, or the last ones taken back, one at a time in that order until `extra` are
    taken: still a prefix, so the heap's answer from any level; from the water level, in at
    most about D steps (taking back only where the level's float rounding overshot)."""
    taken = _taken(base, step, level, extra)
    have = int(taken.sum())
    if have < extra:
        heap = [(base[p] + (taken[p] + 1) * step[p], p) for p in range(len(base))]
        heapq.heapify(heap)
        for _ in range(extra - have):
            _, p = heapq.heappop(heap)
            taken[p] += 1
            heapq.heappush(heap, (base[p] + (taken[p] + 1) * step[p], p))
    elif have > extra:  # the last taken, largest (value, p) first
        heap = [(-(base[p] + taken[p] * step[p]), -p) for p in range(len(base)) if taken[p] > 0]
        heapq.heapify(heap)
        for _ in range(have - extra):
            _, minus_p = heapq.heappop(heap)
            taken[-minus_p] -= 1
            if taken[-minus_p] > 0:
                heapq.heappush(heap, (-(base[-minus_p] + taken[-minus_p] * step[-minus_p]), minus_p))
    return taken


def _bisected(base: np.ndarray, step: np.ndarray, extra: int) -> np.ndarray:
    """The same answer by bisection on the value of the last one handed out (over the bits of a
    non-negative float64, which order like the floats), in O(D·64)."""
    lo, hi = 0, int(np.float64(np.min(base + extra * step)).view(np.int64))
    while lo < hi:  # the smallest value v with at least `extra` next-values ≤ v
        mid = (lo + hi) // 2
        if _taken(base, step, float(np.int64(mid).view(np.float64)), extra).sum() >= extra:
            hi = mid
        else:
            lo = mid + 1
    v = float(np.int64(lo).view(np.float64))
    below = _taken(base, step, float(np.nextafter(v, -np.inf)), extra) if lo > 0 else np.zeros(len(base), np.int64)
    ties = _taken(base, step, v, extra) - below  # values equal to v: the lower p first
    room = extra - int(below.sum())
    take = np.minimum(ties, np.maximum(room - (np.cumsum(ties) - ties), 0))
    return below + take


def _taken(base: np.ndarray, step: np.ndarray, v: float, cap: int) -> np.ndarray:
    """Per pipeline: how many k ≥ 1 have base + k·step ≤ v (as the heap computes it), at most
    `cap`. base + k·step rounds monotonically in k, so a float estimate needs at most a few
    corrections."""
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.where(step > 0, np.floor((v - base) / np.where(step > 0, step, 1.0)), cap)
    k = np.clip(np.nan_to_num(guess, nan=0.0, posinf=cap, neginf=0.0), 0, cap).astype(np.int64)
    k = np.where((step == 0) & (base + step > v), 0, k)
    while np.any(over := (k > 0) & (base + k * step > v)):
        k = k - over
    while np.any(under := (k < cap) & (base + (k + 1) * step <= v)):
        k = k + under
    return k
