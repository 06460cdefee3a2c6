"""Structure moves: a local search over the plan's *shape* (which stages, in which pipelines,
in which order, at which TP size), where the polish only moves layers and micro-batches.

A structure is a tuple of pipelines, each a tuple of `StageSlot`s (a TP group on one
machine); the devices of no slot are idle. Its neighbours (`neighbours`):
- drop a stage or a whole pipeline (its devices go idle);
- detach a stage as a pipeline of its own; move a stage into another pipeline at any place;
- split a pipeline in two at any cut; merge two pipelines (either order);
- swap two neighbouring stages; reverse a pipeline;
- add idle devices as a stage (at any place of any pipeline) or as a new pipeline; add a stage
  of idle devices of one GPU type at the same place in every pipeline;
- replace a stage by idle devices; move a whole pipeline onto one machine's idle devices;
- explode a pipeline (or the whole plan) into single-stage pipelines; split a pipeline (or
  every pipeline) into two at half the TP size;
- change TP: split a stage into two halves, halve it, double it with idle devices of its
  machine, merge two neighbouring equal stages of one machine (in one pipeline, or at the same
  place in every pipeline).

Each neighbour is assembled like phase 2 (memory-bounded water-filling, batches by speed,
memory repair) and priced by the evaluator; the best few are polished (layers and
micro-batches) and the best of those replaces the current plan while T drops. At a local
optimum two pipelines may exchange their tails (`crossovers`), then two moves at once are tried
(the lookahead); the crossovers are kept out of the ordinary neighbours because, tried every
round, they spent the work limit that the 64-GPU clusters needed for ordinary moves. Only where
all of that finds nothing, and where every pipeline visits the machines in one order, that
order changes in every pipeline at once (`_reorders_everywhere`: reversed, or one machine's run
of stages moved), on a work allowance of its own; the climb then goes on from there. So the
search follows its old path to its old end first: among the ordinary neighbours, or after the
crossovers, the reorders had led hetero-1 13B at D = 2 away from its merge (31.18 and 31.02 s
against 30.81). Devices of a
machine are interchangeable (docs/formulation.md [R1]), so neighbours that differ only by
device ids are priced once. Deterministic: neighbours are listed in a fixed order and ties
keep the first.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import numpy as np

from planner.layered.plan import Plan
from planner.layered.pricing import breakdown, iteration_time
from planner.layered.table import stage_table
from planner.layered.validate import validate
from planner.problem import Problem
from solvers.layered.heuristic.assemble import make_plan, plan_from_table, repair_memory, split_batches, with_split
from solvers.layered.heuristic.pipeline import StageSlot, split_layers

Structure = tuple[tuple[StageSlot, ...], ...]
RELATIVE_GAIN = 1e-9  # a structure must lower T by more than rounding noise
POLISHED_PER_ROUND = 3  # neighbours polished per round (the best by their unpolished T)
LOOKAHEAD = 4  # when no neighbour helps, the neighbours of this many best neighbours are tried


def structure_of(problem: Problem, plan: Plan) -> Structure:
    machine_of = problem.cluster.machine_of_device
    return tuple(tuple(StageSlot(machine=int(machine_of[s.devices[0]]), devices=tuple(s.devices))
                       for s in pipe.stages) for pipe in plan.pipelines)


def shape_key(structure: Structure) -> tuple:
    """What T depends on [R1]: per pipeline, its stages' (machine, TP size), pipelines as a set."""
    return tuple(sorted(tuple((s.machine, s.tp) for s in pipe) for pipe in structure))


def assemble(problem: Problem, structure: Structure, equal_batch: bool = False) -> Plan | None:
    """Phase 2's split for a given structure: layers by memory-bounded water-filling, batches
    by speed, the memory repair. None when a pipeline cannot hold the model."""
    d, total = len(structure), problem.training.micro_batches
    if d == 0 or d > total or any(not pipe for pipe in structure):
        return None
    micro = max(1, total // d)
    layers = [split_layers(problem, list(pipe), micro, d) for pipe in structure]
    if any(x is None for x in layers):
        return None
    draft = make_plan(problem, [list(p) for p in structure], layers, [1] * d)
    table = stage_table(problem, draft)
    batches = split_batches(problem, table, equal_batch)
    table = with_split(table, table.layers, batches, problem.training.micro_batch)
    fixed = repair_memory(problem, table)
    if fixed is None:
        return None
    return plan_from_table(problem, draft, with_split(table, fixed, batches, problem.training.micro_batch))


# -- neighbours -----------------------------------------------------------------------------


def idle_devices(problem: Problem, structure: Structure) -> dict[int, list[int]]:
    """Idle device ids per machine (sorted)."""
    used = {d for pipe in structure for s in pipe for d in s.devices}
    cluster = problem.cluster
    return {m: [d for d in cluster.devices_of(m) if d not in used] for m in range(len(cluster.machines))}


def _replace(structure: Structure, p: int, pipe: tuple[StageSlot, ...] | None) -> Structure:
    """Pipeline p replaced by `pipe` (dropped when None or empty)."""
    out = list(structure)
    if pipe:
        out[p] = pipe
    else:
        del out[p]
    return tuple(out)


def _removals(structure: Structure) -> Iterator[Structure]:
    """Drop a stage or a pipeline; detach a stage as its own pipeline; split a pipeline."""
    for p, pipe in enumerate(structure):
        if len(structure) > 1:
            yield _replace(structure, p, None)
        for k in range(len(pipe)):
            if len(pipe) > 1:
                rest = pipe[:k] + pipe[k + 1:]
                yield _replace(structure, p, rest)
                yield _replace(structure, p, rest) + ((pipe[k],),)
        for cut in range(1, len(pipe)):
            yield _replace(structure, p, pipe[:cut]) + (pipe[cut:],)
        if len(pipe) > 2:  # every stage a pipeline of its own
            yield _replace(structure, p, None) + tuple((s,) for s in pipe)
    if len(structure) > 1 and any(len(pipe) > 1 for pipe in structure):  # every stage of the plan
        yield tuple((s,) for pipe in structure for s in pipe)


def _halve(problem: Problem, pipe: tuple[StageSlot, ...]) -> tuple[tuple[StageSlot, ...], ...] | None:
    """Two pipelines of the same stages at half the TP size (TP traded for DP), or None."""
    if any(s.tp < 2 or s.tp // 2 not in problem.model.tp_sizes(s.tp // 2) for s in pipe):
        return None
    return (tuple(StageSlot(machine=s.machine, devices=s.devices[: s.tp // 2]) for s in pipe),
            tuple(StageSlot(machine=s.machine, devices=s.devices[s.tp // 2:]) for s in pipe))


def _tp_to_dp(problem: Problem, structure: Structure) -> Iterator[Structure]:
    """One pipeline, or every pipeline, split into two at half the TP size."""
    halves = [_halve(problem, pipe) for pipe in structure]
    for p, h in enumerate(halves):
        if h is not None:
            yield _replace(structure, p, None) + h
    if len(structure) > 1 and all(h is not None for h in halves):
        yield tuple(x for h in halves for x in h)


def _transfers(structure: Structure) -> Iterator[Structure]:
    """Move a stage into another pipeline (any place); merge two pipelines; reorder."""
    for p, pipe in enumerate(structure):
        for q, other in enumerate(structure):
            if q == p:
                continue
            for k in range(len(pipe)):
                for at in range(len(other) + 1):
                    out = list(structure)
                    out[q] = other[:at] + (pipe[k],) + other[at:]
                    out[p] = pipe[:k] + pipe[k + 1:]
                    yield tuple(x for x in out if x)
            if q > p:
                yield tuple(x for i, x in enumerate(structure) if i not in (p, q)) + (pipe + other,)
                yield tuple(x for i, x in enumerate(structure) if i not in (p, q)) + (other + pipe,)
        for k in range(len(pipe) - 1):
            yield _replace(structure, p, pipe[:k] + (pipe[k + 1], pipe[k]) + pipe[k + 2:])
        if len(pipe) > 2:
            yield _replace(structure, p, pipe[::-1])


def _blocks(pipe: tuple[StageSlot, ...]) -> list[tuple[StageSlot, ...]]:
    """A pipeline's runs of consecutive stages on one machine."""
    out: list[tuple[StageSlot, ...]] = []
    for s in pipe:
        if out and out[-1][0].machine == s.machine:
            out[-1] += (s,)
        else:
            out.append((s,))
    return out


def _reorders_everywhere(structure: Structure) -> Iterator[Structure]:
    """Where every pipeline visits the machines in one order: that order reversed, or one
    machine's run of stages moved to another place, in every pipeline at once. Alike pipelines
    gain only together (T is a max over them), and which machine holds the embedding or the
    head changes T (hetero-2 7B, an A800 first: 10.738 s; the 3090s first, the A800 next to
    last: 10.716 s)."""
    blocks = [_blocks(pipe) for pipe in structure]
    order = [b[0].machine for b in blocks[0]]
    if len(structure) < 2 or len(order) < 3 or any([b[0].machine for b in bs] != order for bs in blocks):
        return
    yield tuple(pipe[::-1] for pipe in structure)
    for i in range(len(order)):
        for j in range(len(order) + 1):  # before block j; len: to the end
            if j not in (i, i + 1):
                yield tuple(_moved(bs, i, j) for bs in blocks)


def _moved(blocks: list[tuple[StageSlot, ...]], i: int, j: int) -> tuple[StageSlot, ...]:
    """The stages with block i moved to just before block j (j = len: to the end)."""
    rest = blocks[:i] + blocks[i + 1:]
    at = j if j < i else j - 1
    return sum(rest[:at] + [blocks[i]] + rest[at:], ())


def crossovers(structure: Structure) -> list[Structure]:
    """Two pipelines exchange their tails after any cut of each: several stages change pipeline
    at once, as when a fast stage should change partners (gen-40 seed 4)."""
    out = []
    for p, pipe in enumerate(structure):
        for q in range(p + 1, len(structure)):
            other = structure[q]
            for i in range(1, len(pipe)):
                for j in range(1, len(other)):
                    swapped = list(structure)
                    swapped[p], swapped[q] = pipe[:i] + other[j:], other[:j] + pipe[i:]
                    out.append(tuple(swapped))
    return out


def _additions(problem: Problem, structure: Structure, idle: dict[int, list[int]]) -> Iterator[Structure]:
    """A stage of idle devices: a new pipeline, or inserted anywhere in a pipeline."""
    for m, free in idle.items():
        for t in problem.model.tp_sizes(len(free)) if free else ():
            slot = StageSlot(machine=m, devices=tuple(free[:t]))
            yield structure + ((slot,),)
            for p, pipe in enumerate(structure):
                for at in range(len(pipe) + 1):
                    yield _replace(structure, p, pipe[:at] + (slot,) + pipe[at:])


def _additions_everywhere(problem: Problem, structure: Structure, idle: dict[int, list[int]]) -> Iterator[Structure]:
    """A stage of idle devices of one GPU type (TP size t, each inside one machine) inserted at
    the same place in every pipeline: alike pipelines gain from more devices only together."""
    machines = problem.cluster.machines
    for gpu in dict.fromkeys(m.gpu for m in machines):
        free_of = {m: free for m, free in idle.items() if machines[m].gpu == gpu and free}
        for t in problem.model.tp_sizes(max(map(len, free_of.values()), default=0)):
            slots = [StageSlot(machine=m, devices=tuple(free[i * t:(i + 1) * t]))
                     for m, free in free_of.items() for i in range(len(free) // t)]
            if len(slots) < len(structure):
                continue
            for at in range(min(map(len, structure)) + 1):
                yield tuple(pipe[:at] + (slot,) + pipe[at:] for pipe, slot in zip(structure, slots))


def _relocations(problem: Problem, structure: Structure, idle: dict[int, list[int]]) -> Iterator[Structure]:
    """A stage replaced by a stage of idle devices (any machine, any TP size); a whole
    pipeline moved onto one machine's idle devices, stage by stage at the same TP sizes."""
    slots = [StageSlot(machine=m, devices=tuple(free[:t])) for m, free in idle.items() if free
             for t in problem.model.tp_sizes(len(free))]
    for p, pipe in enumerate(structure):
        for k in range(len(pipe)):
            for slot in slots:
                yield _replace(structure, p, pipe[:k] + (slot,) + pipe[k + 1:])
        need = sum(s.tp for s in pipe)
        for m, free in idle.items():
            if len(free) >= need and all(s.tp in problem.model.tp_sizes(len(free)) for s in pipe):
                at, moved = 0, []
                for s in pipe:
                    moved.append(StageSlot(machine=m, devices=tuple(free[at:at + s.tp])))
                    at += s.tp
                yield _replace(structure, p, tuple(moved))


def _tp_changes(problem: Problem, structure: Structure, idle: dict[int, list[int]]) -> Iterator[Structure]:
    """Split a stage in two halves, halve it, double it from idle devices, merge two
    neighbouring equal stages of one machine."""
    allowed = problem.model.tp_sizes
    for p, pipe in enumerate(structure):
        for k, s in enumerate(pipe):
            half = s.tp // 2
            if s.tp >= 2 and half in allowed(half):
                a = StageSlot(machine=s.machine, devices=s.devices[:half])
                b = StageSlot(machine=s.machine, devices=s.devices[half:])
                yield _replace(structure, p, pipe[:k] + (a, b) + pipe[k + 1:])
                yield _replace(structure, p, pipe[:k] + (a,) + pipe[k + 1:])
            free = idle[s.machine]
            if len(free) >= s.tp and 2 * s.tp in allowed(2 * s.tp):
                grown = StageSlot(machine=s.machine, devices=tuple(sorted(s.devices + tuple(free[:s.tp]))))
                yield _replace(structure, p, pipe[:k] + (grown,) + pipe[k + 1:])
            if k + 1 < len(pipe):
                n = pipe[k + 1]
                if n.machine == s.machine and n.tp == s.tp and 2 * s.tp in allowed(2 * s.tp):
                    merged = StageSlot(machine=s.machine, devices=tuple(sorted(s.devices + n.devices)))
                    yield _replace(structure, p, pipe[:k] + (merged,) + pipe[k + 2:])


def _merges_everywhere(problem: Problem, structure: Structure) -> Iterator[Structure]:
    """Stages k and k + 1 merged into one TP stage in every pipeline at once (where each pipeline's
    two are equal and on one machine): alike pipelines gain together or not at all, since T is a
    max over them (homo-a800-4x8 30B: the last two one-device stages of four pipelines, 37.24 s →
    36.62 s)."""
    if len(structure) < 2:
        return
    for k in range(min(map(len, structure)) - 1):
        merged = []
        for pipe in structure:
            s, n = pipe[k], pipe[k + 1]
            if n.machine != s.machine or n.tp != s.tp or 2 * s.tp not in problem.model.tp_sizes(2 * s.tp):
                break
            merged.append(pipe[:k] + (StageSlot(machine=s.machine, devices=tuple(sorted(s.devices + n.devices))),)
                          + pipe[k + 2:])
        else:
            yield tuple(merged)


def neighbours(problem: Problem, structure: Structure) -> list[Structure]:
    """Every neighbour of the structure (module docstring), one per shape, in a fixed order."""
    idle = idle_devices(problem, structure)
    seen, out = {shape_key(structure)}, []
    for cand in (*_merges_everywhere(problem, structure), *_removals(structure), *_transfers(structure),
                 *_additions(problem, structure, idle), *_additions_everywhere(problem, structure, idle),
                 *_relocations(problem, structure, idle), *_tp_to_dp(problem, structure), *_tp_changes(problem, structure, idle)):
        key = shape_key(cand)
        if cand and key not in seen:
            seen.add(key)
            out.append(cand)
    return out


# -- the search -----------------------------------------------------------------------------


def improve(problem: Problem, plan: Plan, *, polish: Callable[[Plan], Plan], deadline: float,
            max_rounds: int = 50, max_stages: int | None = None, max_pipelines: int | None = None,
            max_tp: int | None = None, priced: dict | None = None, max_evaluations: int = 400) -> Plan:
    """Hill-climb over structures from `plan` (polished already) while T drops. When no
    neighbour helps, two moves at once: the neighbours of the LOOKAHEAD best neighbours (a
    plan's T is a max over pipelines, so one pipeline's gain often shows only with another's).
    At most `max_evaluations` new shapes are assembled (a work limit, not a time limit, so
    the result does not depend on the machine's speed)."""
    current, best_t = plan, iteration_time(problem, plan, check=False)
    limits = _Limits(problem, deadline, (max_stages, max_pipelines, max_tp), {} if priced is None else priced,
                     max_evaluations)
    for _ in range(max_rounds):
        structure = structure_of(problem, current)
        ranked = limits.ranked(neighbours(problem, structure))
        step = _best_polished(problem, ranked[:POLISHED_PER_ROUND], polish, best_t, deadline)
        if step is None:
            crossed = limits.ranked(crossovers(structure))
            step = _best_polished(problem, crossed[:POLISHED_PER_ROUND], polish, best_t, deadline)
        if step is None:
            second = [c for _, _, p in ranked[:LOOKAHEAD] for c in neighbours(problem, structure_of(problem, p))]
            step = _best_polished(problem, limits.ranked(second)[:POLISHED_PER_ROUND], polish, best_t, deadline)
        if step is None:  # a local optimum of every move above: the last resort, on shapes of its own
            reorders = list(_reorders_everywhere(structure))
            limits.last_new += len(reorders)
            step = _best_polished(problem, limits.ranked(reorders)[:POLISHED_PER_ROUND], polish, best_t, deadline)
        if step is None:
            break
        best_t, current = step
    return current


class _Limits:
    """The user's limits, the deadline and the shapes priced so far (unpolished T, plan)."""

    def __init__(self, problem: Problem, deadline: float, sizes: tuple[int | None, int | None, int | None],
                 priced: dict, evaluations: int):
        self.problem, self.deadline, self.priced = problem, deadline, priced
        self.max_stages, self.max_pipelines, self.max_tp = sizes  # None: no limit
        self.last_new = len(priced) + evaluations  # no new shape once `priced` holds this many

    def ranked(self, candidates: list[Structure]) -> list[tuple[float, int, Plan]]:
        """The candidates that assemble, by unpolished T (first listed first on ties)."""
        out = []
        for cand in candidates:
            if time.perf_counter() > self.deadline:
                break
            if (self.max_pipelines and len(cand) > self.max_pipelines) or (
                    self.max_stages and max(map(len, cand)) > self.max_stages) or (
                    self.max_tp and max(s.tp for pipe in cand for s in pipe) > self.max_tp):
                continue
            key = shape_key(cand)
            if key not in self.priced and len(self.priced) >= self.last_new:
                continue
            if key not in self.priced:
                built = assemble(self.problem, cand)
                self.priced[key] = _priced(self.problem, built) if built else (np.inf, None)
            if self.priced[key][1] is not None:
                out.append((self.priced[key][0], len(out), self.priced[key][1]))
        return sorted(out)


def _priced(problem: Problem, plan: Plan) -> tuple[tuple[float, float], Plan]:
    """((T, Σ_p T_pipe), plan): neighbours are ranked by T, ties by the pipelines' summed time —
    the polish's tie-break (polish.slack_gain). A neighbour that only speeds up a pipeline that
    is not the slowest ties with the plan on T; polished, it can take a micro-batch from the
    slowest (h800-h20-16-24: the H20 pipeline's two t = 2 stages merged, 68.7545 → 68.659 s),
    but among the ties, listed late, it was never one of the POLISHED_PER_ROUND polished."""
    times = breakdown(problem, stage_table(problem, plan))
    return (times.iteration, float(np.sum(times.pipe_time))), plan


def _best_polished(problem: Problem, ranked, polish, best_t: float, deadline: float):
    """(T, plan) of the best valid polished candidate below best_t, if any."""
    best = None
    for _, _, cand in ranked:
        if time.perf_counter() > deadline:
            break
        cand = polish(cand)
        t = iteration_time(problem, cand, check=False)
        if t < (best[0] if best else best_t) * (1 - RELATIVE_GAIN) and not validate(problem, cand):
            best = (t, cand)
    return best
