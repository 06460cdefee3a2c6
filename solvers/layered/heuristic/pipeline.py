"""Phase 2: turn one pool of devices into a pipeline (docs/solvers.md §5).

Steps, per pool:
1. secondary partition: the pool's devices grouped by machine (the fast links; a stage never
   leaves a machine), each machine part cut into TP groups whose size the cost model picks;
2. order: a top-τ (beam) greedy search over the machine parts, cheapest PP links first;
3. layers: water-filling, one layer at a time to the stage where it raises the estimated
   pipeline time least, never past a stage's memory bound;
4. prune: drop stages whose devices cost more (bubble, PP hops) than they add, while the
   pipeline's own T_pipe, priced by the evaluator, drops.

Every time and byte figure comes from `planner.layered.cost`; nothing here retypes a formula.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from planner.cost import p2p_time
from planner.layered import cost
from planner.layered.cost import StageShape
from planner.layered.pricing import stage_times
from planner.problem import Problem
from planner.layered.table import StageTable, table_of_stages

PREFIX_TRIALS = 6  # how many "drop the j slowest stages" sizes j to try (geometric)
EXHAUSTIVE_LAYOUTS = 16  # pools with at most this many TP layouts over at most
EXHAUSTIVE_PARTS = 6  # this many machines, in clusters of at most
EXHAUSTIVE_CLUSTER = 128  # this many devices, build and price every layout
SINGLE_DROP_STAGES = 6  # pipelines up to this long also try dropping any single stage
GROUPED_SCORE_MACHINES = 16  # pools of more machines price a layout per class of alike machines
HOP_MATRIX_MACHINES = 1024  # pools up to this many machines price all PP hops at once


@dataclass(frozen=True)
class StageSlot:
    """A stage before its layer count is known: a TP group on one machine."""

    machine: int
    devices: tuple[int, ...]

    @property
    def tp(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class PipelineLimits:
    """How phase 2 builds one pool's pipeline: the micro-batches it is built for (an estimate
    before the batch split) and the search's knobs."""

    micro: int  # m the layer split and the pruning price the pipeline with
    tp_cap: int | None = None  # largest TP size a stage may take (None: any the model allows)
    fixed_tp: int | None = None  # ablation: this one TP size for every stage
    beam_width: int = 4  # top-τ width of the stage-order search
    max_stages: int | None = None  # at most this many stages (None: up to L)
    pipelines: int = 1  # D the pool is one of: under ZeRO-1 the memory bound shards optimizer state over D


# -- secondary partition: TP groups per machine part ---------------------------------------


def machine_parts(problem: Problem, pool: np.ndarray) -> dict[int, list[int]]:
    """The pool's devices grouped by machine (sorted, deterministic)."""
    machine_of = problem.cluster.machine_of_device
    parts: dict[int, list[int]] = {}
    for d in sorted(int(x) for x in pool):
        parts.setdefault(int(machine_of[d]), []).append(d)
    return parts


def group_sizes(count: int, t: int, allowed: list[int], fixed: bool) -> list[int]:
    """Cut `count` devices into groups of size t, the remainder into smaller allowed sizes
    (binary decomposition). With `fixed`, the remainder stays idle."""
    sizes = [t] * (count // t)
    rest = count - t * len(sizes)
    if not fixed:
        for s in sorted(allowed, reverse=True):
            while s <= rest:
                sizes.append(s)
                rest -= s
    return sizes


def per_layer_time(problem: Problem, machine: np.ndarray, t: np.ndarray) -> np.ndarray:
    """τ of one layer on a stage of t devices of `machine` (compute + TP traffic)."""
    return cost.stage_time(problem.model, problem.training, StageShape.on(problem.cluster, machine, t, 1))


def estimated_pipe_time(problem: Problem, machines: list[int], sizes: list[list[int]], micro: int) -> float:
    """Rough T_pipe of a pool for a TP layout, to rank layouts before building them.

    With layers spread in proportion to stage speed every stage takes about L / R per
    micro-batch (R = Σ 1/τ_layer, layers per second); 1F1B then costs (m − 1 + S)·L/R, plus
    the PP hops inside machines (one per extra stage) and the steady cost of the slowest hop."""
    rate, stages, intra_hops, top = _layout_terms(problem, machines, sizes)
    return _estimate(problem, micro, rate, stages, intra_hops, top)


def _layout_terms(problem: Problem, machines: list[int], sizes: list[list[int]]) -> tuple[float, int, float, float]:
    """R (Σ 1/τ_layer), S, the PP hops inside machines and the slowest hop of a TP layout."""
    model, training, cluster = problem.model, problem.training, problem.cluster
    per_machine = [len(s) for s in sizes]
    mach = np.repeat(machines, per_machine)
    t = np.concatenate([np.asarray(s, dtype=float) for s in sizes]) if sizes else np.zeros(0)
    if len(t) == 0:
        return 0.0, 0, 0.0, 0.0
    rate = float(np.sum(1.0 / per_layer_time(problem, mach, t)))
    bw, lat = cluster.machine_intra_bw[mach], cluster.machine_intra_lat[mach]
    hop = cost.stage_pp_time(model, training, link_bw_gbps=bw, link_lat_s=lat, t_next=t,
                              bw_next_gbps=bw, lat_next_s=lat)
    intra_hops = float(np.sum(hop) - np.sum(hop[np.cumsum(per_machine) - 1]))
    return rate, len(t), intra_hops, float(hop.max())


def _estimate(problem: Problem, micro: int, rate: float, stages: float, intra_hops: float, top: float) -> float:
    if stages == 0:
        return np.inf
    stage = problem.model.layers / rate
    return (micro - 1 + stages) * stage + intra_hops + (micro - 1) * max(0.0, top - stage)


def part_kinds(problem: Problem, parts: dict[int, list[int]]) -> dict[tuple, list[int]]:
    """Machine parts alike (GPU type, intra bandwidth, device count), in first-seen order."""
    kinds: dict[tuple, list[int]] = {}
    for m in parts:
        mm = problem.cluster.machines[m]
        kinds.setdefault((mm.gpu, mm.intra_bw_gbps, len(parts[m])), []).append(m)
    return kinds


def coordinate_descent(options: dict[tuple, list[int]], score) -> dict[tuple, int]:
    """One size per kind: from the largest of each, change one kind's size at a time while
    `score` drops by more than rounding noise."""
    choice = {k: options[k][-1] for k in options}
    best = score(choice)
    improved = True
    while improved:
        improved = False
        for k in sorted(options):
            for t in options[k]:
                trial = {**choice, k: t}
                s = score(trial)
                if s < best * (1 - 1e-9):
                    best, choice, improved = s, trial, True
    return choice


def tp_layouts(problem: Problem, parts: dict[int, list[int]], limits: PipelineLimits,
               ) -> list[dict[int, list[int]]]:
    """Candidate group sizes per machine part. Parts alike (same machine kind and device
    count) take the same size. If the kinds allow few combinations, all of them (each is then
    built and priced); else the one `estimated_pipe_time` prefers by coordinate descent."""
    model, fixed_tp = problem.model, limits.fixed_tp
    machines = list(parts)
    if fixed_tp is not None:  # a size the model cannot shard by leaves no layout at all
        if fixed_tp not in model.tp_sizes(fixed_tp):
            return []
        return [{m: group_sizes(len(parts[m]), fixed_tp, [], fixed=True) for m in machines}]
    kinds = part_kinds(problem, parts)
    options = {k: model.tp_sizes(min(k[2], limits.tp_cap or k[2])) for k in kinds}

    def layout(ch):
        return {m: group_sizes(len(parts[m]), ch[k], options[k], fixed=False)
                for k, ms in kinds.items() for m in ms}

    score = _layout_score(problem, parts, kinds, options, limits.micro)
    names = sorted(kinds)
    small = problem.cluster.num_devices <= EXHAUSTIVE_CLUSTER and len(parts) <= EXHAUSTIVE_PARTS
    if small and np.prod([len(options[k]) for k in names]) <= EXHAUSTIVE_LAYOUTS:
        return [layout(dict(zip(names, combo))) for combo in itertools.product(*(options[k] for k in names))]
    return [layout(coordinate_descent(options, score))]


def _layout_score(problem: Problem, parts: dict[int, list[int]], kinds: dict[tuple, list[int]],
                  options: dict[tuple, list[int]], micro: int):
    """`estimated_pipe_time` of a choice of one TP size per kind. Pools of many machines are
    priced from per-class terms (a class: machines alike in kind, intra latency and speed),
    each TP size of each class priced once, then summed with the class's count."""
    machines = list(parts)
    if len(machines) <= GROUPED_SCORE_MACHINES:
        def score(ch):
            lay = {m: group_sizes(len(parts[m]), ch[k], options[k], fixed=False) for k, ms in kinds.items() for m in ms}
            return estimated_pipe_time(problem, machines, [lay[m] for m in machines], micro)
        return score
    lat, flops = problem.cluster.machine_intra_lat, problem.cluster.machine_flops
    classes: dict[tuple, list[int]] = {}
    for k, ms in kinds.items():
        for m in ms:
            classes.setdefault((k, float(lat[m]), float(flops[m])), []).append(m)
    terms = {}  # (kind, class index) -> {t: (R, S, intra hops, top hop) × count}
    for i, ((k, _, _), ms) in enumerate(classes.items()):
        for t in options[k]:
            r, n, h, top = _layout_terms(problem, [ms[0]], [group_sizes(len(parts[ms[0]]), t, options[k], fixed=False)])
            terms.setdefault((k, i), {})[t] = (r * len(ms), n * len(ms), h * len(ms), top)

    def grouped(ch):
        parts_of = [terms[key][ch[key[0]]] for key in terms]
        return _estimate(problem, micro, sum(x[0] for x in parts_of), sum(x[1] for x in parts_of),
                         sum(x[2] for x in parts_of), max(x[3] for x in parts_of))
    return grouped


# -- ordering: top-τ greedy over machine parts --------------------------------------------


def order_parts(problem: Problem, machines: list[int], width: int) -> list[int]:
    """Beam search for a machine order with the cheapest PP hops between neighbours.

    Starts from the parts with the most memory per device (the first stages keep the most
    micro-batches in flight); ties break on machine index, so the result is deterministic."""
    if len(machines) <= 1:
        return list(machines)
    cluster = problem.cluster
    a = cost.activation_message_bytes(problem.model, problem.training)
    mach = np.asarray(machines)
    hop = _hop_rows(cluster, mach, a)
    memory = cluster.machine_memory_bytes[mach]
    starts = sorted(range(len(mach)), key=lambda i: (-memory[i], -cluster.machine_flops[mach[i]], i))
    beam = [(0.0, [i]) for i in starts[:width]]
    for _ in range(len(mach) - 1):
        grown = []
        for total, seq in beam:
            free = np.ones(len(mach), bool)
            free[seq] = False
            nxt = np.flatnonzero(free)
            costs = total + hop(seq[-1], nxt)
            for c, j in sorted(zip(costs.tolist(), nxt.tolist()))[:width]:
                grown.append((c, seq + [j]))
        grown.sort(key=lambda x: (x[0], x[1]))
        beam = grown[:width]
    return [machines[i] for i in beam[0][1]]


def _hop_rows(cluster, mach: np.ndarray, a: float):
    """p2p time of the activation between the pool's machines i and cols: one matrix for a
    pool of few machines, else row by row (a pool of 10^4 machines would need gigabytes)."""
    if len(mach) <= HOP_MATRIX_MACHINES:
        table = p2p_time(a, cluster.pair_bw(mach[:, None], mach[None, :]),
                              cluster.pair_lat(mach[:, None], mach[None, :]))
        return lambda i, cols: table[i, cols]
    return lambda i, cols: p2p_time(a, cluster.pair_bw(mach[i], mach[cols]), cluster.pair_lat(mach[i], mach[cols]))


# -- layer split with memory bounds ---------------------------------------------------------


def stage_coefficients(problem: Problem, slots: list[StageSlot], micro: int, pipelines: int = 1):
    """Per stage: τ per layer, τ of the LM head, and the most layers memory allows
    (with the q of the training's schedule for `micro` micro-batches)."""
    model, training, cluster = problem.model, problem.training, problem.cluster
    mach = np.array([s.machine for s in slots])
    t = np.array([s.tp for s in slots])
    size = len(slots)
    first = (np.arange(size) == 0).astype(int)
    last = (np.arange(size) == size - 1).astype(int)
    per_layer = per_layer_time(problem, mach, t)
    q = cost.in_flight_micro_batches(training, size, np.arange(size), micro)
    shape = StageShape.on(cluster, mach, t, 0, first=first, last=last, in_flight=q, pipelines=pipelines)
    head = cost.stage_compute_time(model, training, shape)  # the head alone (n = 0): τ = C, no TP
    max_layers = cost.max_layers_fitting(model, training, shape, cluster.machine_memory_bytes[mach])
    return per_layer, head, max_layers


def split_layers(problem: Problem, slots: list[StageSlot], micro: int, pipelines: int = 1) -> np.ndarray | None:
    """Layers per stage minimising the slowest stage: each stage gets one, and the other
    layers go, one by one, where the stage finishes earliest with it (water-filling, done as
    one sort of every stage's k-th layer end time; ties go to the faster stage). Never past a
    stage's memory bound. None if the pool cannot hold the model."""
    per_layer, head, max_layers = stage_coefficients(problem, slots, micro, pipelines)
    big_l, size = problem.model.layers, len(slots)
    if size > big_l or np.any(max_layers < 1) or max_layers.sum() < big_l:
        return None
    extra = np.minimum(max_layers, big_l) - 1  # layers each stage may take beyond its first
    owner = np.repeat(np.arange(size), extra)
    rank = np.arange(len(owner)) - np.repeat(np.cumsum(extra) - extra, extra) + 2  # k = 2, 3, ...
    finish = head[owner] + rank * per_layer[owner]
    chosen = owner[np.lexsort((per_layer[owner], finish))[: big_l - size]]
    return 1 + np.bincount(chosen, minlength=size)


# -- one pool → one pipeline -----------------------------------------------------------------


def slot_speeds(problem: Problem, slots: list[StageSlot]) -> np.ndarray:
    """Layers per second of each stage slot (1 / τ of one layer)."""
    return 1.0 / per_layer_time(problem, np.array([s.machine for s in slots]), np.array([s.tp for s in slots]))


def fastest_slots(problem: Problem, slots: list[StageSlot], limit: int) -> list[StageSlot]:
    """Keep the `limit` fastest stages (the rest of their devices stay idle)."""
    speed = slot_speeds(problem, slots)
    keep = sorted(np.argsort(-speed, kind="stable")[:limit])
    return [slots[i] for i in keep]


def single_table(problem: Problem, slots: list[StageSlot], layers: np.ndarray, micro: int) -> StageTable:
    """The stage table of a plan with this one pipeline (what `stage_table` would build)."""
    return table_of_stages(
        sizes=np.array([len(slots)]), machine=np.array([s.machine for s in slots]),
        tp=np.array([s.tp for s in slots]), layers=np.asarray(layers),
        batch=np.array([micro * problem.training.micro_batch]), micro_batch=problem.training.micro_batch)


def single_pipe_time(problem: Problem, slots: list[StageSlot], layers: np.ndarray, micro: int) -> float:
    """T_pipe of one pipeline alone with `micro` micro-batches [3.1–3.3]."""
    _, _, tau, pp = stage_times(problem, single_table(problem, slots, layers, micro))
    return cost.pipeline_time(tau, pp, micro)


def _try(problem: Problem, slots: list[StageSlot], micro: int, pipelines: int = 1):
    split = split_layers(problem, slots, micro, pipelines)
    if split is None:
        return None
    return single_pipe_time(problem, slots, split, micro), slots, split


def prune(problem: Problem, slots: list[StageSlot], layers: np.ndarray, micro: int, pipelines: int = 1):
    """Leave idle the stages that cost more (bubble, PP hops) than they add, as long as the
    pipeline's own T_pipe drops: first the j slowest stages for the best j, then, on short
    pipelines, single stages anywhere (a fast device behind a slow link)."""
    best = (single_pipe_time(problem, slots, layers, micro), slots, layers)
    slowest = np.argsort(slot_speeds(problem, slots), kind="stable")
    prefixes = np.geomspace(1, len(slots) - 1, PREFIX_TRIALS) if len(slots) > 1 else []
    for j in sorted({int(x) for x in prefixes}):
        drop = set(slowest[:j].tolist())
        trial = _try(problem, [s for k, s in enumerate(slots) if k not in drop], micro, pipelines)
        if trial is not None and trial[0] < best[0] * (1 - 1e-9):
            best = trial
    while SINGLE_DROP_STAGES >= len(best[1]) > 1:
        trials = [_try(problem, best[1][:k] + best[1][k + 1:], micro, pipelines) for k in range(len(best[1]))]
        trials = [t for t in trials if t is not None and t[0] < best[0] * (1 - 1e-9)]
        if not trials:
            break
        best = min(trials, key=lambda t: t[0])
    return best[1], best[2]


def build_pipeline(problem: Problem, pool: np.ndarray, *, limits: PipelineLimits, cache: dict | None = None):
    """(stages, layers) for one pool, or None if it cannot hold the model. `cache` keeps
    results by (pool, TP layout): TP caps that lead to the same layout are built once."""
    parts = machine_parts(problem, pool)
    best, best_t = None, np.inf
    for layout in tp_layouts(problem, parts, limits):
        key = (tuple(int(d) for d in pool), tuple((m, tuple(v)) for m, v in layout.items()), limits.micro,
               limits.beam_width, limits.max_stages, limits.pipelines)
        if cache is not None and key in cache:
            built = cache[key]
        else:
            built = _build(problem, parts, layout, limits)
            if cache is not None:
                cache[key] = built
        if built is not None:
            t = single_pipe_time(problem, *built, limits.micro)
            if t < best_t:
                best, best_t = built, t
    return best


def _orientations(problem: Problem, slots: list[StageSlot], micro: int, pipelines: int = 1) -> list[list[StageSlot]]:
    """The order and, if it can hold the model, its reverse: the PP hops cost the same both
    ways, but the LM head and the in-flight activations sit at different ends."""
    reverse = slots[::-1]
    return [slots, reverse] if split_layers(problem, reverse, micro, pipelines) is not None else [slots]


def ordered_slots(problem: Problem, parts: dict[int, list[int]], layout: dict[int, list[int]], *,
                  beam_width: int, limit: int) -> list[StageSlot]:
    """The TP groups in pipeline order (machine parts kept together), at most `limit`: the
    `limit` fastest are chosen first (the others stay idle), then only their machines are
    ordered, so a pool of 10^4 machines costs no more than the L stages it can use."""
    slots = {m: [] for m in parts if layout[m]}
    for m in slots:
        devices, at = parts[m], 0
        for size in layout[m]:
            slots[m].append(StageSlot(machine=m, devices=tuple(devices[at: at + size])))
            at += size
    flat = [s for m in slots for s in slots[m]]
    if len(flat) > limit:
        keep = set(fastest_slots(problem, flat, limit))
        slots = {m: [s for s in v if s in keep] for m, v in slots.items()}
        slots = {m: v for m, v in slots.items() if v}
    return [s for m in order_parts(problem, list(slots), beam_width) for s in slots[m]]


def _build(problem: Problem, parts: dict[int, list[int]], layout: dict[int, list[int]], limits: PipelineLimits):
    """Order, layer split, orientation and pruning for one TP layout of one pool."""
    micro, d = limits.micro, limits.pipelines
    limit = min(problem.model.layers, limits.max_stages or problem.model.layers)
    slots = ordered_slots(problem, parts, layout, beam_width=limits.beam_width, limit=limit)
    while slots:
        if split_layers(problem, slots, micro, d) is not None:
            ways = [(order, split_layers(problem, order, micro, d)) for order in _orientations(problem, slots, micro, d)]
            if len(slots) > 2 * SINGLE_DROP_STAGES:  # long pipelines: prune the better way only
                ways = [min(ways, key=lambda w: single_pipe_time(problem, *w, micro))]
            return min((prune(problem, *w, micro, d) for w in ways),
                       key=lambda built: single_pipe_time(problem, *built, micro))
        # a stage that cannot hold even one layer is left idle; else the pool is too small
        _, _, max_layers = stage_coefficients(problem, slots, micro, d)
        if np.all(max_layers >= 1):
            return None
        slots = [s for s, n in zip(slots, max_layers) if n >= 1]
    return None
