"""Polish of a sequence plan: local search over the moves of `solvers.sequence.moves`, every
candidate priced by the planner (docs/sequence-plans.md §7.2–§7.3).

One replica's ring at a time: all its neighbours are priced together (`ring_overflow`), the
best few by T_mb (memory overflow first) are judged as the whole plan — batches split again,
T_dp included — and the best whole plan is kept while it improves. Small rings try every
move; large ones only moves from the most to the least loaded members and groups.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np

from planner.base import GIB
from planner.problem import Problem
from solvers.sequence import moves
from solvers.sequence.coarse import device_speed
from solvers.sequence.space import Ring, dp_time, ring_overflow, split_batches

BIG = 1e12  # scores of rings that do not fit: BIG + overflow in GiB
WIDE = 16  # rings of at most this many members try every move
FOCUS = 4  # otherwise, this many most and least loaded groups
JUDGED = 3  # candidates per step judged as the whole plan
MAX_STEPS = 2000


def _scores(problem: Problem, rings: list[Ring]) -> tuple[np.ndarray, np.ndarray]:
    tmb, over = ring_overflow(problem, rings)
    return np.where(over > 0, BIG + over / GIB, tmb), np.maximum(over, 0.0)


@dataclass
class State:
    """A plan being polished: rings, each ring's T_mb (score) and overflow, batches, T."""

    problem: Problem
    rings: list[Ring]
    scores: list[float] = field(default_factory=list)
    overs: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    key: tuple[float, float] = (np.inf, np.inf)
    dp: dict = field(default_factory=dict)  # T_dp by the replicas' device sets
    sets: list[frozenset] = field(default_factory=list)  # each replica's devices
    step_s: float = 0.0  # the longest polish step so far (a step starts only if one as long fits)

    def judge(self, r: int, ring: Ring, score: float, over: float) -> tuple[tuple[float, float], list[int]]:
        """(Σ overflow, T) of the plan with replica r's ring replaced, batches split again:
        T = max_r m_r·T_mb(r) + T_dp, T_dp from the replicas' device sets (cached)."""
        problem = self.problem
        scores = self.scores[:r] + [score] + self.scores[r + 1:]
        overs = self.overs[:r] + [over] + self.overs[r + 1:]
        micro = problem.training.global_batch // problem.training.micro_batch
        m = split_batches(micro, scores)
        mine = _devices(ring)
        sets = tuple(self.sets[:r] + [mine] + self.sets[r + 1:]) if len(self.rings) > 1 else (mine,)
        if sets not in self.dp:
            self.dp[sets] = dp_time(problem, self.rings[:r] + [ring] + self.rings[r + 1:])
        t = max(x * s for x, s in zip(m, scores)) + self.dp[sets]
        return (float(sum(overs)) / GIB, float(t)), [x * problem.training.micro_batch for x in m]

    def accept_best(self, r: int, rings: list[Ring], scores: list[float], overs: list[float]) -> bool:
        """Replace replica r's ring by the best of `rings` if it makes the plan better."""
        judged = [(self.judge(r, ring, s, o), i) for i, (ring, s, o) in enumerate(zip(rings, scores, overs))]
        if not judged:
            return False
        (key, batches), i = min(judged, key=lambda x: (x[0][0], x[1]))
        if key >= self.key:
            return False
        self.rings[r], self.scores[r], self.overs[r] = rings[i], scores[i], overs[i]
        self.sets[r] = _devices(rings[i])
        self.key, self.batches = key, batches
        return True

    @classmethod
    def start(cls, problem: Problem, rings: list[Ring]) -> State:
        state = cls(problem, list(rings))
        scores, overs = _scores(problem, rings)
        state.scores, state.overs = scores.tolist(), overs.tolist()
        state.sets = [_devices(ring) for ring in rings]
        state.key, state.batches = state.judge(0, rings[0], state.scores[0], state.overs[0])
        return state


def _devices(ring: Ring) -> frozenset:
    return frozenset(x[0] for g in ring for x in g)


def _focus(problem: Problem, ring: Ring) -> list[int]:
    """Groups whose moves are tried: all of a small ring, else the most and least loaded."""
    if sum(len(g) for g in ring) <= WIDE:
        return list(range(len(ring)))
    speed = device_speed(problem)
    load = [sum(m[2] for m in g) / float(sum(speed[m[0]] for m in g)) for g in ring]
    order = sorted(range(len(ring)), key=lambda g: (load[g], g))
    return sorted(set(order[:FOCUS] + order[-FOCUS:]))


def _extremes(problem: Problem, group, count: int, heaviest: bool, extra: int = 0) -> list[int]:
    """`count` picks of members, greedily the one with the largest (or least) (t_i + extra·q)/π_i."""
    speed, q = device_speed(problem), problem.training.token_block
    tokens = [m[2] for m in group]
    picks = []
    for _ in range(count):
        load = [(tokens[i] + (0 if heaviest else q)) / float(speed[m[0]]) for i, m in enumerate(group)]
        i = max(range(len(group)), key=lambda j: (load[j], -j)) if heaviest else \
            min(range(len(group)), key=lambda j: (load[j], j))
        picks.append(i)
        tokens[i] += -q if heaviest else q
    return picks


def _pairs(problem: Problem, group, wide: bool) -> list[tuple[int, int]]:
    """Member pairs (src, dst) of a group whose moves are tried: all of them in small rings,
    else the most and the least loaded member (t_i/π_i), both ways."""
    n = len(group)
    if wide or n <= 2:
        return [(i, j) for i in range(n) for j in range(n) if i != j]
    hi, lo = _extremes(problem, group, 1, True)[0], _extremes(problem, group, 1, False)[0]
    return [(hi, lo), (lo, hi)] if hi != lo else []


def _token_moves(problem: Problem, ring: Ring, groups: list[int], wide: bool) -> list[Ring | None]:
    q = problem.training.token_block
    out: list[Ring | None] = []
    for g in groups:
        out += [moves.shift(ring, q, [(g, i)], [(g, j)]) for i, j in _pairs(problem, ring[g], wide)]
        for h in groups:
            if h != g:
                src = _extremes(problem, ring[g], 2, True)
                dst = _extremes(problem, ring[h], 2, False)
                out.append(moves.shift(ring, q, [(g, i) for i in src], [(h, j) for j in dst]))
    return out


def neighbours(problem: Problem, ring: Ring) -> list[Ring]:
    """Every move of `moves` on the focused groups that gives a ring."""
    per_kv = problem.model.heads // problem.model.num_kv_heads
    wide = sum(len(g) for g in ring) <= WIDE
    groups = _focus(problem, ring)
    out = _token_moves(problem, ring, groups, wide)
    for g in groups:
        out += [moves.move_head(ring, per_kv, g, i, j) for i, j in _pairs(problem, ring[g], wide)]
        out += [moves.swap(ring, g), moves.merge(problem, ring, g), moves.split(problem, ring, g)]
        out += [moves.drop(ring, g, i) for i in range(len(ring[g]))] if wide else []
    return [c for c in out if c is not None]


def polish_ring(state: State, r: int, deadline: float, rng: random.Random, max_steps: int = MAX_STEPS) -> bool:
    """Improve replica r's ring while a move helps (at most `max_steps`) and a step as long as
    the longest so far ends by the deadline; True if anything changed."""
    changed = False
    for _ in range(max_steps):
        began = time.perf_counter()
        if began + state.step_s > deadline:
            break
        cands = neighbours(state.problem, state.rings[r])
        if not cands:
            break
        rng.shuffle(cands)  # the seed decides ties between equal scores
        scores, overs = _scores(state.problem, cands)
        best = np.argsort(scores, kind="stable")[:JUDGED].tolist()
        accepted = state.accept_best(r, [cands[i] for i in best], scores[best].tolist(), overs[best].tolist())
        state.step_s = max(state.step_s, time.perf_counter() - began)
        if not accepted:
            break
        changed = True
    return changed


def polish(problem: Problem, start: State | list[Ring], deadline: float, seed: int = 0,
           max_steps: int | None = None) -> State:
    """Polish every replica's ring in turn (from these rings, or a `State.start` of them that
    is changed in place) until a full round changes nothing or the deadline comes."""
    state = start if isinstance(start, State) else State.start(problem, start)
    rng = random.Random(seed)
    steps = MAX_STEPS if max_steps is None else max_steps
    for _ in range(8):
        if not any([polish_ring(state, r, deadline, rng, steps) for r in range(len(state.rings))]):
            break
    return state
