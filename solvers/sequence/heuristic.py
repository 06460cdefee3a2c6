"""HexiSeq's two-stage scheduler for sequence plans (docs/sequence-plans.md §7), any cluster size.

Stage 1, global coarse placement (`coarse`): for every device set (all machines, without
the slowest GPU types, without the slowest machines), HP degree and number of replicas D,
groups from machines, groups dealt to replicas, each ring ordered by a top-τ greedy search
over link bandwidth, shards in proportion to group speed; the device sets of the best plans
then grow by whole idle machines while that helps. Stage 2, local fine-grained split
(`coarse.fine_split`) of each group's heads and tokens over its members. Every candidate is
priced by the planner; the best few, and the best `seq-uniform` layout (`uniform_starts`:
the heuristic is never slower than that baseline), are polished (`polish`: token blocks
and heads moved, groups swapped, merged, split, members dropped, batches split again) and
the best plan is returned.

Deterministic per seed while the time limit does not cut the search. `SolverOptions.time_limit_s`
bounds the whole solve at any cluster size (`deadline.Clock`): the uniform starts get the
first UNIFORM_SHARE of it (the likely best families priced first), the coarse plans run
until COARSE_SHARE, polish until the end less the time to build, check and price the
returned plan; a step starts only when the longest step of its kind so far still fits. The
first plan may come FIRST_PLAN_LATE_S late; past that the search gives up. Status `feasible`
with the best plan so far; `infeasible` only when the memory bound of `space.memory_proof`
proves it; `unknown` otherwise (its message says when the limit ran out before any plan).
"""

from __future__ import annotations

import itertools
import math
import time
from contextlib import nullcontext
from functools import cached_property

import numpy as np
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.progress import terminal_progress
from solvers.sequence.coarse import DEALS, coarse_rings, deal_replicas, degrees, devices_by_speed, growth_machines, \
    join_ring, machine_groups, replica_counts, shards_cover
from solvers.sequence.baselines import type_ranking
from solvers.sequence.polish import State, polish
from solvers.sequence.regroup import regroup
from solvers.sequence.deadline import FIRST_PLAN_LATE_S, Candidate, Clock, plan_building, polish_end
from solvers.sequence.space import Ring, memory_proof, result
from solvers.sequence.uniform_starts import UNIFORM, best_uniform
from planner.base import plural

POLISHED = 6  # coarse plans polished on small clusters (and the best of every other D)
POLISHED_LARGE = 2  # on large ones
STAGED_TOP = 3  # coarse plans of large clusters tried without their slowest machines
STAGED_D = 4  # and the best plan of each of this many best D
LARGE_STEPS = 40  # polish steps per ring on large clusters
REGROUP_DEVICES = 32  # clusters up to this size also move groups between replicas
MAX_DROPPED = 3  # slowest machines left out, at most, in the device sets tried
FEW_DEVICES = 16  # clusters this small try every number of fastest devices
SUBSET_MACHINES = 4  # clusters of this few machines try every subset of machines
GROW_FROM = 3  # device sets of this many best coarse plans grown by idle machines
JOIN_PER_TYPE = 4  # idle machines of each GPU type tried in every replica of the returned plan
GROW_ROUNDS = 8  # growth steps of each (a machine, or one per replica), at most
UNIFORM_SHARE = 0.4  # of the time limit: the uniform starts (a plan early on any cluster)
COARSE_SHARE = 0.75  # coarse plans priced and grown until this share of it; then polish


def type_sets(problem: Problem) -> list[list[int]]:
    """The devices of the fastest t GPU types, t = all of them down to 1 (ranked as
    `seq-uniform` ranks them: compute time per token, attention included), fastest first."""
    order = np.array(devices_by_speed(problem), dtype=np.int64)
    cluster = problem.cluster
    rank = {name: i for i, name in enumerate(type_ranking(problem))}
    of = np.array([rank[m.gpu] for m in cluster.machines])[cluster.machine_of_device[order]]
    return [order[of < t].tolist() for t in range(len(rank), 0, -1)]


def device_sets(problem: Problem) -> tuple[list[list[int]], int]:
    """The devices tried, fastest first, and how many of them (the first ones) are the
    `type_sets` — the whole cluster first, then without the slowest GPU types, where a
    uniform layout often runs best: whole machines — every subset of them on clusters of at
    most SUBSET_MACHINES machines, else without the slowest 1 .. MAX_DROPPED machines — and on
    small clusters also every prefix of the devices in speed order."""
    order = devices_by_speed(problem)
    machine = problem.cluster.machine_of_device
    machines = list(dict.fromkeys(machine[order].tolist()))
    if len(machines) <= SUBSET_MACHINES:
        chosen = [list(c) for k in range(len(machines), 0, -1) for c in itertools.combinations(machines, k)]
    else:
        chosen = [machines[:len(machines) - k] for k in range(min(MAX_DROPPED, len(machines) - 1) + 1)]
    by_type = list({tuple(x): x for x in type_sets(problem)}.values())
    ordered = np.array(order, dtype=np.int64)
    out = by_type + [ordered[np.isin(machine[ordered], c)].tolist() for c in chosen]
    if len(order) <= FEW_DEVICES:
        out += [order[:k] for k in range(len(order), 0, -1)]
    return list({tuple(x): x for x in out}.values()), len(by_type)


Label = tuple[int, int, int, str]  # (device set index, HP degree, D, deal)


class Coarse:
    """Stage-1 plans by label, built and priced once each."""

    def __init__(self, problem: Problem, clock: Clock, deadline: float, bar=None, have_plan: bool = False):
        self.problem, self.clock, self.deadline, self.bar = problem, clock, deadline, bar
        self.have_plan = have_plan  # a uniform start exists: no coarse plan is needed in time
        self.found: dict[Label, Candidate | None] = {}
        self.groups: dict[tuple[int, int], list[list[int]]] = {}

    def price(self, label: Label) -> Candidate | None:
        if label not in self.found:
            self.found[label] = self.clock.timed("coarse", self._built_and_priced, label)
            if self.bar is not None:
                self.bar.update(self.bar.task_ids[0], description=f"sequence heuristic: coarse {label}")
        return self.found[label]

    def _built_and_priced(self, label: Label) -> Candidate | None:
        rings = self.build(label)
        return None if rings is None else _priced(self.problem, label, rings, self.clock)

    def build(self, label: Label) -> list[Ring] | None:
        s, degree, d, by = label
        groups = self.groups_of(s, degree)
        dealt = deal_replicas(self.problem, groups, d, by)
        if dealt is None or (by != DEALS[0] and dealt == deal_replicas(self.problem, groups, d)):
            return None
        if any(not shards_cover(self.problem, r) for r in dealt):
            return None  # what `coarse_ring` would find, before ordering thousands of rings
        rings = coarse_rings(self.problem, dealt, until=self.deadline if self.has_plan() else math.inf)
        return rings if rings is not None and all(r is not None for r in rings) else None

    @cached_property
    def sets(self) -> list[list[int]]:
        """The device sets (`device_sets`), built when first asked: a solve out of time before
        its first coarse plan never builds them (0.3 s at 100k GPUs)."""
        sets, self._swept = device_sets(self.problem)
        self._index = {tuple(sorted(x)): i for i, x in enumerate(sets)}
        return sets

    @property
    def swept(self) -> int:
        """How many of the first `sets` are the `type_sets`."""
        return self._swept if self.sets is not None else 0

    def groups_of(self, s: int, degree: int) -> list[list[int]]:
        """`machine_groups` of device set s, kept (the staged sweep and every build ask)."""
        if (s, degree) not in self.groups:
            self.groups[(s, degree)] = machine_groups(self.problem, self.sets[s], degree)
        return self.groups[(s, degree)]

    def set_of(self, devices: list[int]) -> int:
        """The index of this device set (added when new)."""
        key, sets = tuple(sorted(devices)), self.sets
        if key not in self._index:
            self._index[key] = len(sets)
            sets.append(list(devices))
        return self._index[key]

    def grow(self, starts: list[Candidate]) -> None:
        """The device sets of the GROW_FROM best coarse plans (best per set) and of `starts`
        (as coarse plans of their HP degree and D) grown by whole idle machines
        (`growth_machines`), one or D at a time (one for each replica: a machine that joins
        one replica alone leaves the others as slow, and T is the slowest's), while the plan of
        the same HP degree, D and deal gets faster: a few slower machines next to the fast
        ones often help where a whole slower GPU type does not (1,024 GPUs at s = 2^20: 256
        devices in use and 376 s where 518 give 295 s, growing one machine at a time)."""
        seeds: dict[int, Candidate] = {}
        for c in self.ranked():
            seeds.setdefault(c[3][0], c)
        chosen = list(seeds.values())[:GROW_FROM]
        for _, _, rings, label in starts:
            devices = [m[0] for ring in rings for g in ring for m in g]
            if not self.out_of_time():
                chosen += [c for c in [self.price((self.set_of(devices), label[1], label[2], DEALS[0]))] if c]
        for best in chosen:
            for _ in range(GROW_ROUNDS if not self.out_of_time() else 0):
                s, replicas = best[3][0], best[3][2]
                blocks = [block[:k] for block in growth_machines(self.problem, self.sets[s], replicas)
                          for k in sorted({1, len(block)})]
                tried = [self.price((self.set_of(self.sets[s] + self.machine_devices(block)), *best[3][1:]))
                         for block in blocks if not self.out_of_time()]
                better = min((c for c in tried if c is not None), key=lambda c: (c[0], c[3]), default=None)
                if better is None or better[0] >= best[0]:
                    break
                best = better

    def machine_devices(self, machines: list[int]) -> list[int]:
        return [d for m in machines for d in self.problem.cluster.devices_of(m)]

    def has_plan(self) -> bool:
        """Whether some plan exists (a uniform start or a coarse plan): steps may then be cut."""
        return self.have_plan or any(self.found.values())

    def out_of_time(self) -> bool:
        """Past the phase's deadline (a coarse plan as long as the longest so far, or before the
        first one half the uniform phase, would end after it) once some plan exists."""
        if self.clock.too_late():
            return True
        guess = self.clock.took.get("uniform", 0.0) / 2
        return not self.clock.allows("coarse", self.deadline, guess) and self.has_plan()

    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.found.values() if c is not None), key=lambda c: (c[0], c[3]))

    def every(self) -> None:
        """Small clusters: every device set × HP degree × D × deal."""
        for s in range(len(self.sets)):
            for degree in degrees(self.problem):
                if self.out_of_time():  # once out of time, always (took and found only grow)
                    return
                groups = len(self.groups_of(s, degree))
                for d, by in itertools.product(replica_counts(self.problem, groups), DEALS):
                    if self.out_of_time():
                        return
                    self.price((s, degree, d, by))

    def staged(self) -> None:
        """Large clusters: every HP degree × D (powers of two) on the whole cluster and
        without its slowest GPU types (`type_sets`), dealt by speed (the whole cluster also
        striped: equal mixed replicas); the STAGED_TOP best dealt by device count too; the
        STAGED_TOP best of all and the best of each of the STAGED_D best D on the other device
        sets (slowest machines left out)."""
        for s in range(self.swept):
            for degree in degrees(self.problem):
                if self.out_of_time():  # once out of time, always (took and found only grow)
                    return
                groups = len(self.groups_of(s, degree))
                for d in powers_up_to(replica_counts(self.problem, groups, limit=64)):
                    for by in ("speed", "striped") if s == 0 else ("speed",):  # the whole cluster striped too
                        if not self.out_of_time():
                            self.price((s, degree, d, by))
        for c in self.ranked()[:STAGED_TOP]:
            for by in DEALS[1:]:
                if not self.out_of_time():
                    self.price((c[3][0], *c[3][1:3], by))
        best = self.ranked()[:STAGED_TOP]
        best += [c[0] for c in list(_by_d(self.ranked()).values())[:STAGED_D]]
        for s in range(self.swept, len(self.sets)):
            for c in best:
                if not self.out_of_time():
                    self.price((s, *c[3][1:]))


def _by_d(found: list[Candidate]) -> dict[int, list[Candidate]]:
    """Candidates (ranked) by D, in the order of each D's best."""
    out: dict[int, list[Candidate]] = {}
    for c in found:
        out.setdefault(c[3][2], []).append(c)
    return out


def powers_up_to(counts: list[int]) -> list[int]:
    """1, 2, 4, … among `counts`, and the largest."""
    return sorted({c for c in counts if c & (c - 1) == 0} | {max(counts)})


def _priced(problem: Problem, label: tuple, rings: list[Ring], clock: Clock) -> Candidate:
    state = clock.timed("start", State.start, problem, rings)
    return state.key, state.batches, state.rings, label


def search(problem: Problem, options: SolverOptions, clock: Clock) -> tuple[Candidate, Coarse] | None:
    """Price the best uniform layout and the coarse plans (while time lasts), polish the
    best few and the uniform one, keep the best: never slower than `seq-uniform`."""
    small = problem.cluster.num_devices <= FEW_DEVICES
    with _progress(options) as bar:
        uniform = clock.timed("uniform", best_uniform, problem, clock.at(UNIFORM_SHARE),
                              clock.at(1.0) + FIRST_PLAN_LATE_S)
        coarse = Coarse(problem, clock, clock.at(COARSE_SHARE), bar, have_plan=bool(uniform))
        coarse.every() if small else coarse.staged()
        coarse.grow(uniform)
        found = coarse.ranked()
        chosen = to_polish(found) + one_vendor_starts(problem, coarse) if small else found[:POLISHED_LARGE]
        polished = polish_starts(problem, options, clock, uniform + chosen)
    best = min(polished + found[:1] + uniform, key=lambda c: (c[0], c[3]), default=None)
    if best is not None and best[0][0] == 0:
        best = joined(problem, best, polish_end(clock, plan_building(problem, [best])))
    return None if best is None else (best, coarse)


def joined(problem: Problem, best: Candidate, end: float) -> Candidate:
    """The best plan with idle machines joining a replica's ring as more groups (`join_ring`:
    per GPU type the JOIN_PER_TYPE best linked idle machines, every replica), one machine at a
    time while T falls, each tried before `end`: growth of the device sets happens before polish, and
    a polished plan could still gain by it (longctx-sim-128 30B: 4 idle A100s in replica 1
    gave 129.1 s against 135.0 s)."""
    for _ in range(GROW_ROUNDS):
        (_, t), _, rings, label = best
        used = [member[0] for ring in rings for g in ring for member in g]
        blocks = [problem.cluster.devices_of(m) for block in growth_machines(problem, used, JOIN_PER_TYPE)
                  for m in block]
        tried = [found for devices in blocks for r in range(len(rings))
                 if time.perf_counter() < end and (found := join_ring(problem, rings, r, devices)) is not None]
        better = min(tried, key=lambda found: found[0], default=None)
        if better is None or better[0] >= t:
            return best
        best = ((0.0, better[0]), better[1], better[2], label)
    return best


def polish_starts(problem: Problem, options: SolverOptions, clock: Clock, starts: list[Candidate]) -> list[Candidate]:
    """Each start polished in turn while one more can begin: its pricing (`State.start`, as
    long as the longest so far) fits in the time left, less FINAL_PRICING such times for
    pricing the returned plan whole."""
    small = problem.cluster.num_devices <= FEW_DEVICES
    polished = []
    building = plan_building(problem, starts)
    for key, _, rings, label in starts:
        if not clock.allows("start", polish_end(clock, building)):
            break
        state = clock.timed("start", State.start, problem, rings)
        end = polish_end(clock, building)
        state = polish(problem, state, end, options.seed, max_steps=None if small else LARGE_STEPS)
        if problem.cluster.num_devices <= REGROUP_DEVICES:
            state = regroup(problem, state, end, options.seed)
        polished.append((state.key, state.batches, state.rings, label))
    return polished


def to_polish(found: list[Candidate]) -> list[Candidate]:
    """The best POLISHED coarse plans, then the best of every other D (sorted input)."""
    chosen = found[:POLISHED]
    seen = {c[3][2] for c in chosen}
    for c in found[POLISHED:]:
        if c[3][2] not in seen:
            chosen.append(c)
            seen.add(c[3][2])
    return chosen


def one_vendor_starts(problem: Problem, coarse: Coarse) -> list[Candidate]:
    """On a cluster that mixes nvidia and amd (docs/vendors.md §8): the best coarse plan of every
    device set on one vendor, per HP degree. Such a plan never crosses the slow bridge, but
    its coarse form is often memory-tight (fewer devices), so it ranks low until polished."""
    if not problem.cluster.mixes_vendors:
        return []
    side = problem.cluster.machine_bridge_side[problem.cluster.machine_of_device]
    best: dict[tuple[int, int], Candidate] = {}
    for c in coarse.ranked():
        s, degree = c[3][0], c[3][1]
        if len(set(side[coarse.sets[s]].tolist())) == 1:
            best.setdefault((s, degree), c)
    return list(best.values())


def _progress(options: SolverOptions):
    """A transient spinner naming the candidate being priced (when options.progress, on a terminal)."""
    bar = terminal_progress(options, SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    if bar is None:
        return nullcontext(None)
    bar.add_task("sequence heuristic", total=None)
    return bar


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The two-stage scheduler (see the module docstring)."""
    options = options or SolverOptions()
    start = time.perf_counter()
    proof = memory_proof(problem)
    if proof is not None:
        return result("heuristic", problem, start, None, SolveStatus.infeasible, proof)
    found = search(problem, options, Clock(start, options.time_limit_s))
    if found is None or found[0][0][0] > 0:
        why = "no plan found that fits in memory (not proved infeasible)"
        if found is None and time.perf_counter() - start > options.time_limit_s:
            why = f"the time limit of {options.time_limit_s:g} s ran out before any plan was built"
        return result("heuristic", problem, start, None, SolveStatus.unknown, why)
    ((_, t), batches, rings, label), coarse = found
    return result("heuristic", problem, start, (t, batches, rings), SolveStatus.feasible,
                  f"{start_text(coarse, label, rings)}; {len(coarse.found)} coarse plans priced")


def start_text(coarse: Coarse, label: Label, rings: list[Ring]) -> str:
    """Where the returned plan started: the best uniform layout or a coarse plan."""
    if label[3] == UNIFORM:
        return (f"uniform start: HP degree {label[1]}, {plural(label[2], 'replica')} of {plural(len(rings[0]), 'group')}, "
                f"{plural(sum(len(g) for r in rings for g in r), 'device')}")
    return (f"coarse start: {plural(len(coarse.sets[label[0]]), 'device')}, HP degree {label[1]}, "
            f"{plural(label[2], 'replica')} (dealt by {label[3]})")
