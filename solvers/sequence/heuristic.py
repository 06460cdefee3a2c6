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

Deterministic per seed; `SolverOptions.time_limit_s` bounds the search (the first candidate
is always built and priced). Status `feasible` with a plan; `infeasible` only when the
memory bound of `space.memory_proof` proves it; `unknown` otherwise.
"""

from __future__ import annotations

import itertools
import time
from contextlib import nullcontext

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.sequence.coarse import DEALS, coarse_ring, deal_replicas, degrees, devices_by_speed, growth_machines, \
    machine_groups, replica_counts
from solvers.sequence.baselines import type_ranking
from solvers.sequence.polish import State, polish
from solvers.sequence.regroup import regroup
from solvers.sequence.space import Ring, memory_proof, result
from solvers.sequence.uniform_starts import UNIFORM, best_uniform

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
GROW_ROUNDS = 8  # machines added to each, at most

Candidate = tuple[tuple[float, float], list[int], list[Ring], tuple]


def type_sets(problem: Problem) -> list[list[int]]:
    """The devices of the fastest t GPU types, t = all of them down to 1 (ranked as
    `seq-uniform` ranks them: compute time per token, attention included), fastest first."""
    order = devices_by_speed(problem)
    cluster = problem.cluster
    rank = {name: i for i, name in enumerate(type_ranking(problem))}
    of = [rank[cluster.machines[int(cluster.machine_of_device[d])].gpu] for d in order]
    return [[d for d, r in zip(order, of) if r < t] for t in range(len(rank), 0, -1)]


def device_sets(problem: Problem) -> tuple[list[list[int]], int]:
    """The devices tried, fastest first, and how many of them (the first ones) are the
    `type_sets` — the whole cluster first, then without the slowest GPU types, where a
    uniform layout often runs best: whole machines — every subset of them on clusters of at
    most SUBSET_MACHINES machines, else without the slowest 1 .. MAX_DROPPED machines — and on
    small clusters also every prefix of the devices in speed order."""
    order = devices_by_speed(problem)
    machine = problem.cluster.machine_of_device
    machines = list(dict.fromkeys(int(machine[d]) for d in order))
    if len(machines) <= SUBSET_MACHINES:
        chosen = [set(c) for k in range(len(machines), 0, -1) for c in itertools.combinations(machines, k)]
    else:
        chosen = [set(machines[:len(machines) - k]) for k in range(min(MAX_DROPPED, len(machines) - 1) + 1)]
    by_type = list({tuple(x): x for x in type_sets(problem)}.values())
    out = by_type + [[d for d in order if machine[d] in c] for c in chosen]
    if len(order) <= FEW_DEVICES:
        out += [order[:k] for k in range(len(order), 0, -1)]
    return list({tuple(x): x for x in out}.values()), len(by_type)


Label = tuple[int, int, int, str]  # (device set index, HP degree, D, deal)


class Coarse:
    """Stage-1 plans by label, built and priced once each."""

    def __init__(self, problem: Problem, deadline: float, bar=None):
        self.problem, self.deadline, self.bar = problem, deadline, bar
        self.sets, self.swept = device_sets(problem)
        self.index = {tuple(sorted(x)): i for i, x in enumerate(self.sets)}
        self.found: dict[Label, Candidate | None] = {}

    def price(self, label: Label) -> Candidate | None:
        if label not in self.found:
            rings = self.build(label)
            self.found[label] = None if rings is None else _priced(self.problem, label, rings)
            if self.bar is not None:
                self.bar.update(self.bar.task_ids[0], description=f"sequence heuristic: coarse {label}")
        return self.found[label]

    def build(self, label: Label) -> list[Ring] | None:
        s, degree, d, by = label
        groups = machine_groups(self.problem, self.sets[s], degree)
        dealt = deal_replicas(self.problem, groups, d, by)
        if dealt is None or (by != DEALS[0] and dealt == deal_replicas(self.problem, groups, d)):
            return None
        rings = [coarse_ring(self.problem, r) for r in dealt]
        return rings if all(r is not None for r in rings) else None

    def set_of(self, devices: list[int]) -> int:
        """The index of this device set (added when new)."""
        key = tuple(sorted(devices))
        if key not in self.index:
            self.index[key] = len(self.sets)
            self.sets.append(list(devices))
        return self.index[key]

    def grow(self, starts: list[Candidate]) -> None:
        """The device sets of the GROW_FROM best coarse plans (best per set) and of `starts`
        (as coarse plans of their HP degree and D) grown by whole idle machines
        (`growth_machines`), one at a time while the plan of the same HP degree, D and deal
        gets faster: a few slower machines next to the fast ones often help where a whole
        slower GPU type does not."""
        seeds: dict[int, Candidate] = {}
        for c in self.ranked():
            seeds.setdefault(c[3][0], c)
        chosen = list(seeds.values())[:GROW_FROM]
        for _, _, rings, label in starts:
            devices = [m[0] for ring in rings for g in ring for m in g]
            chosen += [c for c in [self.price((self.set_of(devices), label[1], label[2], DEALS[0]))] if c]
        for best in chosen:
            for _ in range(GROW_ROUNDS):
                s = best[3][0]
                tried = [self.price((self.set_of(self.sets[s] + self.problem.cluster.devices_of(m)), *best[3][1:]))
                         for m in growth_machines(self.problem, self.sets[s]) if not self.out_of_time()]
                better = min((c for c in tried if c is not None), key=lambda c: (c[0], c[3]), default=None)
                if better is None or better[0] >= best[0]:
                    break
                best = better

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline and any(self.found.values())

    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.found.values() if c is not None), key=lambda c: (c[0], c[3]))

    def every(self) -> None:
        """Small clusters: every device set × HP degree × D × deal."""
        for s, devices in enumerate(self.sets):
            for degree in degrees(self.problem):
                groups = len(machine_groups(self.problem, devices, degree))
                for d, by in itertools.product(replica_counts(self.problem, groups), DEALS):
                    if self.out_of_time():
                        return
                    self.price((s, degree, d, by))

    def staged(self) -> None:
        """Large clusters: every HP degree × D (powers of two) on the whole cluster and
        without its slowest GPU types (`type_sets`), dealt by speed; the STAGED_TOP best dealt
        by device count too; the STAGED_TOP best of all and the best of each of the STAGED_D
        best D on the other device sets (slowest machines left out)."""
        for s in range(self.swept):
            for degree in degrees(self.problem):
                groups = len(machine_groups(self.problem, self.sets[s], degree))
                for d in powers_up_to(replica_counts(self.problem, groups, limit=64)):
                    if not self.out_of_time():
                        self.price((s, degree, d, DEALS[0]))
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


def _priced(problem: Problem, label: tuple, rings: list[Ring]) -> Candidate:
    state = State.start(problem, rings)
    return state.key, state.batches, state.rings, label


def search(problem: Problem, options: SolverOptions, deadline: float) -> tuple[Candidate, Coarse] | None:
    """Price the best uniform layout and the coarse plans (while time lasts), polish the
    best few and the uniform one, keep the best: never slower than `seq-uniform`."""
    small = problem.cluster.num_devices <= FEW_DEVICES
    with _progress(options) as bar:
        uniform = best_uniform(problem, deadline)
        coarse = Coarse(problem, deadline, bar)
        coarse.every() if small else coarse.staged()
        coarse.grow(uniform)
        found = coarse.ranked()
        chosen = to_polish(found) + one_vendor_starts(problem, coarse) if small else found[:POLISHED_LARGE]
        polished = []
        for key, _, rings, label in uniform + chosen:
            if polished and time.perf_counter() > deadline:
                break
            state = polish(problem, rings, deadline, options.seed, max_steps=None if small else LARGE_STEPS)
            if problem.cluster.num_devices <= REGROUP_DEVICES:
                state = regroup(problem, state, deadline, options.seed)
            polished.append((state.key, state.batches, state.rings, label))
    best = min(polished + found[:1] + uniform, key=lambda c: (c[0], c[3]), default=None)
    return None if best is None else (best, coarse)


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
    """A transient spinner naming the candidate being priced (when options.progress)."""
    if not options.progress:
        return nullcontext(None)
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True)
    bar.add_task("sequence heuristic", total=None)
    return bar


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The two-stage scheduler (see the module docstring)."""
    options = options or SolverOptions()
    start = time.perf_counter()
    proof = memory_proof(problem)
    if proof is not None:
        return result("heuristic", problem, start, None, SolveStatus.infeasible, proof)
    found = search(problem, options, start + options.time_limit_s)
    if found is None or found[0][0][0] > 0:
        return result("heuristic", problem, start, None, SolveStatus.unknown,
                      "no plan found that fits in memory (not proved infeasible)")
    ((_, t), batches, rings, label), coarse = found
    return result("heuristic", problem, start, (t, batches, rings), SolveStatus.feasible,
                  f"{start_text(coarse, label, rings)}; {len(coarse.found)} coarse plans priced")


def start_text(coarse: Coarse, label: Label, rings: list[Ring]) -> str:
    """Where the returned plan started: the best uniform layout or a coarse plan."""
    if label[3] == UNIFORM:
        return (f"uniform start: HP degree {label[1]}, {label[2]} replicas of {len(rings[0])} groups, "
                f"{sum(len(g) for r in rings for g in r)} devices")
    return (f"coarse start: {len(coarse.sets[label[0]])} devices, HP degree {label[1]}, "
            f"{label[2]} replicas (dealt by {label[3]})")
