"""bench_lns's search around a plan: a plan as (machine, t, n) stages, the moves on it, the
rebuilds of freed pipelines, simulated annealing and the large-neighbourhood loop."""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from planner.layered.plan import Plan, devices_in_order
from planner.layered.pricing import breakdown
from planner.layered.rules import structural_violations
from planner.layered.table import stage_table


# -- the plan as (machine, t, n) stages ---------------------------------------------------


class Space:
    """The problem and its machines: pricing of stage lists, the free devices of a layout."""

    def __init__(self, problem):
        self.problem = problem
        cluster = problem.cluster
        self.counts = [m.count for m in cluster.machines]
        self.first = list(np.cumsum([0] + self.counts[:-1]))
        self.machine_of = {}
        for i, (f, c) in enumerate(zip(self.first, self.counts)):
            for d in range(f, f + c):
                self.machine_of[d] = i
        self.layers = problem.model.layers
        self.micro = problem.training.global_batch // problem.training.micro_batch
        self.priced = 0
        self.check = False
        model = problem.model  # rule 2 of planner/layered/rules.py: t a power of two dividing a and k
        self.widths = {t for t in (1, 2, 4, 8, 16, 32, 64) if model.heads % t == 0 and model.kv_heads % t == 0}

    def free(self, pipes):
        used = [0] * len(self.counts)
        for pipe in pipes:
            for m, t, _ in pipe:
                used[m] += t
        return [c - u for c, u in zip(self.counts, used)]

    def plan(self, pipes, micro):
        shapes = [[(m, t) for m, t, _ in pipe] for pipe in pipes]
        devices = devices_in_order(self.first, shapes)
        b = self.problem.training.micro_batch
        return Plan.from_stages(problem=self.problem.name, batches=[k * b for k in micro],
                                stages=[[(d, s[2]) for d, s in zip(dev, pipe)] for dev, pipe in zip(devices, pipes)])

    def price(self, pipes):
        """(T, micro-batches per pipeline) or (inf, None) if the layout is invalid or out of memory."""
        if not valid_layout(self, pipes):
            return math.inf, None
        d = len(pipes)
        if d > self.micro:
            return math.inf, None
        micro = split_micro(self.micro, [1.0] * d, [1.0] * d)
        b = breakdown(self.problem, stage_table(self.problem, self.plan(pipes, micro)))
        starts = np.cumsum([0] + [len(p) for p in pipes])
        steady = [float(np.maximum(b.tau, b.pp)[lo:hi].max()) for lo, hi in zip(starts[:-1], starts[1:])]
        micro = split_micro(self.micro, b.bubble.tolist(), steady)
        b = breakdown(self.problem, stage_table(self.problem, self.plan(pipes, micro)))
        self.priced += 1
        if np.any(b.memory > b.capacity):
            return math.inf, None
        if self.check and structural_violations(self.problem, self.plan(pipes, micro)):
            raise AssertionError(f"the evaluator refuses {describe(pipes)}")
        return b.iteration, micro


def valid_layout(space, pipes):
    if not pipes or any(f < 0 for f in space.free(pipes)):
        return False
    return all(sum(s[2] for s in p) == space.layers and all(s[1] in space.widths and s[2] >= 1 for s in p)
               for p in pipes)


def split_micro(total, bubble, steady):
    """The split of `total` micro-batches (≥ 1 each) minimizing max_p bubble_p + (m_p − 1)·steady_p."""
    micro = [1] * len(bubble)
    heap = [(bubble[p] + steady[p], p) for p in range(len(bubble))]
    heapq.heapify(heap)
    for _ in range(total - len(bubble)):
        _, p = heapq.heappop(heap)
        micro[p] += 1
        heapq.heappush(heap, (bubble[p] + micro[p] * steady[p], p))
    return micro


def from_plan(space, plan):
    return [[[space.machine_of[s.devices[0]], s.tp, s.layers] for s in p.stages] for p in plan.pipelines]


def describe(pipes):
    """One line per pipeline: machine:t×n stages."""
    return [" ".join(f"{m}:{t}x{n}" for m, t, n in p) for p in pipes]


# -- moves --------------------------------------------------------------------------------


def signature(pipe):
    return tuple((m, t) for m, t, _ in pipe)


def alike(pipes, p, together):
    """The pipelines a move on pipeline p changes: p alone, or every pipeline of p's stage pattern."""
    if not together:
        return [p]
    sig = signature(pipes[p])
    return [q for q in range(len(pipes)) if signature(pipes[q]) == sig]


def move_layer(space, pipes, rng, together):
    p = rng.randrange(len(pipes))
    pipe = pipes[p]
    if len(pipe) < 2:
        return None
    i = rng.randrange(len(pipe))
    j = i + rng.choice((-1, 1)) if rng.random() < 0.6 else rng.randrange(len(pipe))
    if j == i or not 0 <= j < len(pipe):
        return None
    k = rng.choice((1, 1, 1, 2))
    for q in alike(pipes, p, together):
        if pipes[q][i][2] <= k:
            return None
        pipes[q][i][2] -= k
        pipes[q][j][2] += k
    return pipes


def move_boundary(space, pipes, rng, together):
    """The stage boundary after layer b − 1 moved by one layer in every pipeline that has one
    there: layers stay aligned across pipelines (the same machines hold them)."""
    b = rng.randrange(1, space.layers)
    step = rng.choice((-1, 1))
    moved = False
    for pipe in pipes:
        ends = np.cumsum([s[2] for s in pipe])
        hits = np.flatnonzero(ends == b)
        if len(hits):
            i = int(hits[0])
            give, take = (pipe[i], pipe[i + 1]) if step < 0 else (pipe[i + 1], pipe[i])
            if give[2] < 2:
                return None
            give[2] -= 1
            take[2] += 1
            moved = True
    return pipes if moved else None


def move_width(space, pipes, rng, together):
    """A stage's TP group doubled or halved (from / to the machine's idle devices)."""
    p = rng.randrange(len(pipes))
    i = rng.randrange(len(pipes[p]))
    wider = rng.random() < 0.5
    for q in alike(pipes, p, together):
        pipes[q][i][1] = pipes[q][i][1] * 2 if wider else pipes[q][i][1] // 2
    return pipes if pipes[p][i][1] >= 1 else None


def move_split(space, pipes, rng, together):
    """A stage cut in two on its machine: its devices shared, or idle devices for the new one."""
    p = rng.randrange(len(pipes))
    i = rng.randrange(len(pipes[p]))
    m, t, n = pipes[p][i]
    if n < 2:
        return None
    t1 = t // 2 if t >= 2 and rng.random() < 0.7 else t
    t2 = t - t1 if t1 < t else rng.choice((1, 1, 2, 4))
    n1 = rng.randrange(1, n)
    after = rng.random() < 0.5
    for q in alike(pipes, p, together):
        parts = [[m, t1, n1], [m, t2, n - n1]]
        pipes[q][i: i + 1] = parts if after else parts[::-1]
    return pipes


def _stage_with_next(pipes, rng):
    """(p, i): a random pipeline and one of its stages that has a next one (None: one stage)."""
    p = rng.randrange(len(pipes))
    if len(pipes[p]) < 2:
        return None
    return p, rng.randrange(len(pipes[p]) - 1)


def move_merge(space, pipes, rng, together):
    picked = _stage_with_next(pipes, rng)
    if picked is None or pipes[picked[0]][picked[1]][0] != pipes[picked[0]][picked[1] + 1][0]:
        return None
    p, i = picked
    keep = rng.random() < 0.5  # keep both groups' devices, or only the wider group
    for q in alike(pipes, p, together):
        a, b = pipes[q][i], pipes[q][i + 1]
        pipes[q][i: i + 2] = [[a[0], a[1] + b[1] if keep else max(a[1], b[1]), a[2] + b[2]]]
    return pipes


def move_swap(space, pipes, rng, together):
    """Two stages of a pipeline change places (their layer counts stay in place)."""
    picked = _stage_with_next(pipes, rng)
    if picked is None:
        return None
    p, i = picked
    j = i + 1 if rng.random() < 0.6 else rng.randrange(len(pipes[p]))
    for q in alike(pipes, p, together):
        _swap_devices(pipes[q][i], pipes[q][j])
    return pipes


def _swap_devices(a, b) -> None:
    """Two stages exchange their machine and width; their layers stay."""
    a[0], a[1], b[0], b[1] = b[0], b[1], a[0], a[1]


def move_exchange(space, pipes, rng, together):
    """Stages of two pipelines exchange their devices (machine and width); layers stay."""
    if len(pipes) < 2:
        return None
    p, q = rng.sample(range(len(pipes)), 2)
    i, j = rng.randrange(len(pipes[p])), rng.randrange(len(pipes[q]))
    _swap_devices(pipes[p][i], pipes[q][j])
    return pipes


def move_transfer(space, pipes, rng, together):
    """A stage moves to another pipeline; both pipelines' layer counts are evened out again."""
    if len(pipes) < 2:
        return None
    p, q = rng.sample(range(len(pipes)), 2)
    if len(pipes[p]) < 2:
        return None
    stage = pipes[p].pop(rng.randrange(len(pipes[p])))
    pipes[q].insert(rng.randrange(len(pipes[q]) + 1), stage)
    for r in (p, q):
        refill(space, pipes[r], rng)
    return pipes


def move_drop(space, pipes, rng, together):
    """A pipeline removed (its devices idle, to be taken by the other moves)."""
    if len(pipes) < 2:
        return None
    pipes.pop(rng.randrange(len(pipes)))
    return pipes


def refill(space, pipe, rng):
    """Layer counts of a pipeline brought back to L: from the stages of most layers per device,
    to the stages of fewest."""
    total = sum(s[2] for s in pipe)
    while total > space.layers:
        s = max((s for s in pipe if s[2] > 1), key=lambda s: (s[2] / s[1], rng.random()))
        s[2] -= 1
        total -= 1
    while total < space.layers:
        s = min(pipe, key=lambda s: (s[2] / s[1], rng.random()))
        s[2] += 1
        total += 1


MOVES = [(move_layer, 4), (move_boundary, 4), (move_width, 2), (move_split, 2), (move_merge, 2), (move_swap, 1),
         (move_exchange, 1), (move_transfer, 1), (move_drop, 0.2)]


# -- construction of freed pipelines ------------------------------------------------------


def layer_time(space, m, t):
    """τ of one layer on a stage of t devices of machine m (the evaluator's own terms)."""
    from planner.layered import cost
    from planner.layered.cost import StageShape
    shape = StageShape.on(space.problem.cluster, m, t, 1)
    return float(cost.stage_time(space.problem.model, space.problem.training, shape))


def tp_groups(count, rng):
    """A random cut of `count` devices of one machine into TP groups."""
    style = rng.randrange(4)
    if style == 0:
        return [1] * count
    if style == 1 and count & (count - 1) == 0:
        return [count]
    if style == 2:
        return [2] * (count // 2) + [1] * (count % 2)
    groups, left = [], count
    while left:
        g = rng.choice([w for w in (1, 2, 4, 8) if w <= left])
        groups.append(g)
        left -= g
    return groups


def build_pipeline(space, per_machine, order, rng):
    """A pipeline over `per_machine` devices (machine → count), machine blocks in `order`,
    layers shared in proportion to each stage's speed."""
    stages = []
    for m in order:
        if per_machine.get(m, 0):
            groups = tp_groups(per_machine[m], rng)
            rng.shuffle(groups)
            stages += [[m, t, 1] for t in groups]
    if not stages or len(stages) > space.layers:
        return None
    speed = np.array([1.0 / layer_time(space, m, t) for m, t, _ in stages])
    share = np.maximum(1, np.floor(speed / speed.sum() * space.layers)).astype(int)
    for s, n in zip(stages, share):
        s[2] = int(n)
    refill(space, stages, rng)
    return stages


def rebuild(space, pipes, rng, free_count=None):
    """Large-neighbourhood step: one or two pipelines removed and k new ones dealt from their
    devices and every idle device (each machine's devices dealt at random to the k)."""
    pipes = [[list(s) for s in p] for p in pipes]
    drop = rng.sample(range(len(pipes)), min(len(pipes), free_count or rng.choice((1, 1, 2))))
    kept = [p for i, p in enumerate(pipes) if i not in drop]
    pool = space.free(kept)
    k = max(1, len(drop) + rng.choice((-1, 0, 0, 0, 1)))
    order = [m for m, _, _ in (kept[0] if kept else [])]
    order = list(dict.fromkeys(order + [m for m in range(len(pool)) if m not in order]))
    if rng.random() < 0.3:
        rng.shuffle(order)
    deal = [dict() for _ in range(k)]
    for m, c in enumerate(pool):
        even = rng.random() < 0.5
        for d in range(c):
            j = d % k if even else rng.randrange(k)
            deal[j][m] = deal[j].get(m, 0) + 1
    new = [build_pipeline(space, per, order, rng) for per in deal]
    return kept + [p for p in new if p]


# -- the search ---------------------------------------------------------------------------


def copy(pipes):
    return [[list(s) for s in p] for p in pipes]


def neighbour(space, pipes, rng):
    moves, weights = zip(*MOVES)
    move = rng.choices(moves, weights)[0]
    return move(space, copy(pipes), rng, rng.random() < 0.5)


def anneal(space, pipes, seconds, rng, temp=(0.05, 0.0005)):
    """Simulated annealing from `pipes`; returns the best (T, pipes, micro) met."""
    cur = copy(pipes)
    cur_t, micro = space.price(cur)
    best = (cur_t, copy(cur), micro)
    start = time.time()
    while (elapsed := time.time() - start) < seconds:
        heat = temp[0] * (temp[1] / temp[0]) ** (elapsed / seconds)
        new = neighbour(space, cur, rng)
        if new is None:
            continue
        t, micro = space.price(new)
        if t <= cur_t or rng.random() < math.exp(-(t - cur_t) / heat):
            cur, cur_t = new, t
            if t < best[0] - 1e-9:
                best = (t, copy(new), micro)
    return best


def lns(space, pipes, seconds, rng, log=print):
    """Anneal; then, until the time is out, rebuild one or two pipelines of the best plan and
    anneal from there, keeping what improves."""
    start = time.time()
    best = anneal(space, pipes, min(60.0, seconds / 4), rng)
    log(f"  anneal from the start: {best[0]:.4f} s")
    while time.time() - start < seconds:
        trial = rebuild(space, best[1], rng)
        got = anneal(space, trial, min(20.0, seconds - (time.time() - start)), rng, temp=(0.02, 0.0005))
        if got[0] < best[0] - 1e-9:
            log(f"  {time.time() - start:6.0f} s: {got[0]:.4f} s  D={len(got[1])}")
            best = got
    return best
