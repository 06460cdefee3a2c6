"""The 1F1B makespan of `planner.pipeline_sim`'s model, computed round by round
(docs/cost-model.md §3.3).

Stage k of S runs w_k = min(S − k − 1, m) warm-up forwards, then m − w_k (forward, backward)
pairs, then w_k backwards. Warm-up step j: stages k < S − 1 − j run forward j, each fed by
the one before it in the same step. Round r: each stage still in its pairs runs forward
r + w_k — fed by what its predecessor sent in the round before — and then every stage runs
backward r, last to first. What a round needs of the past is the state after the round
before: when each stage is next free and when each link, each way, ends its last transfer
(which is also when that transfer arrived).

Rounds 0 … m − S are all alike: one map of the state built of max and +, a max-plus linear
map x ↦ A ⊗ x. Two ways past running them all, so that T for 10^12 micro-batches costs what a
hundred do:
- the watch: every stage waits on the others (1F1B bounds what is in flight), so the map has
  one cycle time λ and the state becomes periodic, x_r = x_{r−c} + c·λ in every entry, after
  a transient; from there each c rounds add c·λ;
- where the transient outlasts the watch (stages and links whose cycles nearly tie settle
  slowly), A itself: one round run on max-plus linear forms instead of numbers gives A, and
  A^N ⊗ x by repeated squaring (O(n³ log N) for n = 3S − 2 state entries).
Both give the rounds' result as running them would, up to the rounding of sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.pipeline_times import PipelineTimes

WATCH_ABOVE = 64  # fewer steady rounds than this are simply run
PERIOD_TOLERANCE = 1e-12  # of a period's time: what rounding leaves of exact repeats
WATCH_ROUNDS = 256  # rounds the watch looks for a period before A ⊗ … takes over


@dataclass
class _State:
    """When each stage is next free, and each link in each direction (its last transfer's end,
    which is also when that transfer arrived). Entries are numbers, or max-plus linear forms
    (arrays over the entries of a starting state) when a round is run to read off A."""

    free: list
    link_f: list
    link_b: list

    @classmethod
    def start(cls, stages: int) -> _State:
        return cls([0.0] * stages, [0.0] * (stages - 1), [0.0] * (stages - 1))

    @classmethod
    def of(cls, vector, stages: int) -> _State:
        entries = list(vector)
        return cls(entries[:stages], entries[stages:2 * stages - 1], entries[2 * stages - 1:])

    def vector(self) -> np.ndarray:
        return np.array(self.free + self.link_f + self.link_b)


def _forwards(st: _State, t: tuple, stages: range, mx=max) -> None:
    """One forward on each stage of `stages`. Ascending, a stage's input is the forward its
    predecessor runs in this same step (the warm-up); descending, the one it sent in the
    round before. Its output goes onto the link after it."""
    f, sf = t[0], t[2]
    for k in stages:
        end = (st.free[k] if k == 0 else mx(st.free[k], st.link_f[k - 1])) + f[k]
        st.free[k] = end
        if k < len(f) - 1:
            st.link_f[k] = mx(end, st.link_f[k]) + sf[k]


def _backwards(st: _State, t: tuple, mx=max) -> None:
    """One backward on every stage, last to first, each waiting for the gradient from the
    stage after it (sent in this step)."""
    b, sb = t[1], t[3]
    last = len(b) - 1
    st.free[last] = st.free[last] + b[last]
    for k in range(last - 1, -1, -1):
        st.link_b[k] = mx(st.free[k + 1], st.link_b[k]) + sb[k]
        st.free[k] = mx(st.free[k], st.link_b[k]) + b[k]


def _full_round(st: _State, t: tuple, mx=max) -> None:
    _forwards(st, t, range(len(t[0]) - 1, -1, -1), mx)
    _backwards(st, t, mx)


def _periodic_shift(history: list[np.ndarray], now: np.ndarray) -> tuple[int, float] | None:
    """(c, c·λ) for the least c where `now` is the state c rounds back shifted by c·λ in every
    entry. Every c at once, one row each (one cycle at a time, the watch was most of the time
    `evaluate` took on a 10^5-GPU plan)."""
    if not history:
        return None
    moved = now[None, :] - np.stack(history[::-1])  # row c − 1: now − the state c rounds back
    mean = moved.mean(axis=1)
    periodic = moved.max(axis=1) - moved.min(axis=1) <= PERIOD_TOLERANCE * np.maximum(np.abs(mean), 1e-300)
    if not periodic.any():
        return None
    first = int(np.argmax(periodic))
    return first + 1, float(mean[first])


def _round_matrix(t: tuple) -> np.ndarray:
    """A of x ↦ A ⊗ x, one steady round: the round run on the unit forms (entry i: 0 at i,
    −∞ elsewhere); the form each entry ends as is its row."""
    stages = len(t[0])
    size = 3 * stages - 2
    unit = np.full((size, size), -np.inf)
    np.fill_diagonal(unit, 0.0)
    st = _State.of(unit, stages)
    _full_round(st, t, np.maximum)
    return np.vstack(st.free + st.link_f + st.link_b)


def _max_plus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a ⊗ b: (a ⊗ b)_ij = max_k a_ik + b_kj (b a matrix or a vector)."""
    if b.ndim == 1:
        return np.max(a + b[None, :], axis=1)
    return np.stack([np.max(row[:, None] + b, axis=0) for row in a])


def _power_apply(matrix: np.ndarray, vector: np.ndarray, times: int) -> np.ndarray:
    """A^times ⊗ x by repeated squaring."""
    while times:
        if times & 1:
            vector = _max_plus(matrix, vector)
        times >>= 1
        if times:
            matrix = _max_plus(matrix, matrix)
    return vector


def _steady_rounds(st: _State, t: tuple, rounds: int) -> _State:
    """The state after `rounds` steady rounds from `st`."""
    history: list[np.ndarray] = []
    for done in range(1, rounds + 1):
        _full_round(st, t)
        if rounds <= WATCH_ABOVE:
            continue
        now = st.vector()
        found = _periodic_shift(history, now)
        if found is not None:
            cycle, shift = found
            periods = (rounds - done) // cycle
            st = _State.of(now + periods * shift, len(t[0]))
            for _ in range(rounds - done - periods * cycle):
                _full_round(st, t)
            return st
        history = (history + [now])[-(2 * len(t[0]) + 2):]
        if done >= WATCH_ROUNDS:
            return _State.of(_power_apply(_round_matrix(t), now, rounds - done), len(t[0]))
    return st


def one_f_one_b_makespan(times: PipelineTimes, micro_batches: int) -> float:
    """The 1F1B makespan of `planner.pipeline_sim`'s model (see this module's note)."""
    t = (times.forward.tolist(), times.backward.tolist(), times.send_forward.tolist(),
         times.send_backward.tolist())
    stages, m = times.stages, micro_batches
    st = _State.start(stages)
    for j in range(min(stages - 1, m)):
        _forwards(st, t, range(stages - 1 - j))
    steady = max(m - stages + 1, 0)
    st = _steady_rounds(st, t, steady)
    for r in range(steady, m):  # the cool-down: stages k < r + S − m are done forwarding
        _forwards(st, t, range(stages - 1, r + stages - m - 1, -1))
        _backwards(st, t)
    return float(max(st.free))
