"""The search loop: over D (pipelines) and the secondary split (TP cap), build a plan for
each candidate, keep the best few by the full evaluator, polish those, improve each by
structure moves (moves.py, clusters up to `move_devices`); return the best, `feasible` (a
heuristic proves nothing). The exact refinement on small clusters is not this package's:
solvers/layered/composed.py runs this search, then CP-SAT from its plan (the heuristic never
reaches the exact models, which warm-start from it: no cycle).

Deterministic for a given seed (METIS and the random baseline take it; nothing reads global
random state). A rich progress bar shows on long runs. `SolverOptions.time_limit_s` bounds
the wall time: the D candidates go nearest a closed-form guess first, the D search stops at
`EXPLORE_SHARE` of the limit (a candidate cut short keeps the pipelines built so far, the
other pools idle, so a plan comes back if one exists), and the polish stops `RESERVE_PRICES`
plan pricings (as measured on the candidates) before the limit, leaving room for its last
round and the final checks.

A hint (`SolverOptions.hint`, e.g. the re-planner's repaired old plan) that is valid for the
problem is polished and improved as one more start beside the search's own best few, so the
result is never worse than the polished hint: a warm start, not only a candidate.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np
from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

from planner.layered.pricing import iteration_time
from planner.cost import usable_memory_bytes
from planner.layered import cost
from planner.layered.plan import Plan
from planner.solver_info import SolverInfo, SolveStatus
from planner.problem import Problem
from planner.layered.table import stage_table
from planner.layered.validate import validate
from solvers.common import SolveResult, SolverOptions
from solvers.progress import terminal_progress
from solvers.layered.tables import Tables, explain_infeasible
from solvers.layered.heuristic.assemble import build_plan, plan_from_table, with_split
from solvers.layered.heuristic.moves import improve
from solvers.layered.heuristic.options import HeuristicOptions
from solvers.layered.heuristic.partition import TIERED_MODES, UNEVEN_MODES, partition
from solvers.layered.heuristic.polish import polish
from solvers.layered.heuristic import start_choice
from planner.base import plural

SMALL_CLUSTER = 512  # up to this many devices "auto" tries every split, above it METIS's alone
EXPLORE_SHARE = 0.8  # the D search stops at this share of the time limit (the rest: polish, checks)
OVERSIZE_POOL = 2  # skip D whose pools exceed this many times what L stages can use
RESERVE_PRICES = 30  # the polish stops this many plan pricings before the limit (one polish
# round screens about 20 moves on large plans; the rest is the final plan, validate, result)


def max_pipelines(problem: Problem, options: SolverOptions) -> int:
    """Upper bound on D: micro-batches, devices, and the memory to hold one model replica
    (model states only, μ·P — the optimizer part once across D under ZeRO-1 —, against the
    cluster's memory less the reserves)."""
    cluster, training = problem.cluster, problem.training
    by_memory = cost.replicas_fitting(problem.model, training, usable_memory_bytes(cluster, training))
    bound = min(training.micro_batches, cluster.num_devices, max(1, by_memory))
    return min(bound, options.max_pipelines or bound)


def coarse_candidates(upper: int, count: int) -> list[int]:
    """All D up to `upper` if few, else a geometric grid from 1 to `upper`."""
    if upper <= count:
        return list(range(1, upper + 1))
    grid = np.unique(np.rint(np.geomspace(1, upper, count)).astype(int))
    return [int(x) for x in grid]


def aligned_candidates(problem: Problem, upper: int) -> list[int]:
    """D equal to a machine's device count or to the number of machines (≤ `upper`): there the
    striped pools deal one equal block of every machine to each pipeline, so stage k of every
    pipeline shares a machine and the data-parallel sync stays inside it (homo-a800-3x8 7B:
    D = 8, off the geometric grid, is 7.8 % faster than the grid's best D = 4)."""
    counts = {int(c) for c in problem.cluster.machine_counts} | {len(problem.cluster.machines)}
    return sorted(d for d in counts if 1 <= d <= upper)


def estimated_d(problem: Problem) -> float:
    """A closed-form guess of the best D: devices over the devices a pipeline uses well —
    about L/2 stages of a typical machine's size (more stages only add bubble and PP hops
    at an equal per-pipeline batch, since m = B/(b·D) shrinks as S grows)."""
    counts = problem.cluster.machine_counts
    return max(1.0, 2 * problem.cluster.num_devices / (problem.model.layers * float(np.mean(counts))))


def anytime_order(problem: Problem, ds: list[int]) -> list[int]:
    """The D candidates nearest the closed-form guess first (a good plan early), leaving out
    D whose pools are far larger than L stages can use, while a larger D remains."""
    usable = problem.model.layers * int(problem.cluster.machine_counts.max())
    n = problem.cluster.num_devices
    kept = [d for d in ds if n <= OVERSIZE_POOL * usable * d] or ds[-1:]
    guess = estimated_d(problem)
    return sorted(kept, key=lambda d: (abs(np.log(d / guess)), d))


def refine_candidates(best: int, tried: list[int], upper: int) -> list[int]:
    """Untried D between the best D's neighbours in the coarse grid (at most 6, evenly)."""
    tried = sorted(tried)
    i = tried.index(best)
    lo = tried[i - 1] if i > 0 else 1
    hi = tried[i + 1] if i + 1 < len(tried) else upper
    gap = [d for d in range(lo + 1, hi) if d not in tried]
    if len(gap) > 6:
        gap = sorted({gap[int(round(x))] for x in np.linspace(0, len(gap) - 1, 6)})
    return gap


def protect_modes(problem: Problem, heuristic: HeuristicOptions) -> list[str]:
    """The phase-1 splits tried for each D (`partition.partition`'s modes)."""
    if heuristic.protect == "tiered":
        return list(TIERED_MODES)
    if heuristic.protect == "uneven":
        return list(UNEVEN_MODES)
    if heuristic.protect != "auto":
        return [heuristic.protect]
    if problem.cluster.num_devices <= SMALL_CLUSTER:
        return ["pipeline", "data", "machines", *TIERED_MODES, *UNEVEN_MODES]
    return ["pipeline"]


def within_tp(plan: Plan, max_tp: int | None) -> bool:
    """Every stage of the plan within a hard TP limit (None: no limit)."""
    return max_tp is None or all(s.tp <= max_tp for p in plan.pipelines for s in p.stages)


class Search:
    def __init__(self, problem: Problem, options: SolverOptions, heuristic: HeuristicOptions,
                 reserve_share: float = 0.0):
        self.problem, self.options, self.heuristic = problem, options, heuristic
        self.reserve_share = reserve_share  # of the time left after the polish, for what follows
        self.start = time.perf_counter()
        self.deadline = self.start + options.time_limit_s
        self.explore_share_end = self.start + EXPLORE_SHARE * options.time_limit_s
        self.price_s = 0.0  # the longest pricing of a candidate plan seen (sets the reserve)
        self.found: dict[tuple, tuple[float, Plan]] = {}  # (D, mode, cap) -> (T, plan)
        self.seen_pools: dict[tuple, list] = {}
        self.pipelines: dict = {}  # phase-2 results by (pool, TP layout), shared by all candidates
        self.progress, self.moves_bar = None, None  # a rich Progress; the structure moves' (task, total) on it
        self.hint = options.hint if options.hint is not None and not validate(problem, options.hint) \
            and within_tp(options.hint, heuristic.max_tp) else None

    @property
    def polish_deadline(self) -> float:
        """The limit less the reserve: a polish round and the final steps fit after it."""
        return self.deadline - RESERVE_PRICES * self.price_s

    @property
    def explore_deadline(self) -> float:
        return min(self.explore_share_end, self.polish_deadline)

    def out_of_time(self) -> bool:
        return bool(self.ranked()) and time.perf_counter() > self.explore_deadline


    def pools(self, d: int, mode: str):
        key = (d, mode)
        if key not in self.seen_pools:
            self.seen_pools[key] = partition(self.problem, d, partitioner=self.heuristic.partitioner,
                                             protect=mode, seed=self.options.seed)
        return self.seen_pools[key]

    def try_d(self, d: int, caps: list[int | None]) -> None:
        """Every protect mode with the given TP caps for one D."""
        done_pools = []
        for mode in protect_modes(self.problem, self.heuristic):
            if self.out_of_time():
                return
            pools = self.pools(d, mode)
            signature = sorted(tuple(p.tolist()) for p in pools)
            if signature in done_pools:  # both modes gave the same split
                continue
            done_pools.append(signature)
            for cap in caps:
                if self.out_of_time() or (d, mode, cap) in self.found:
                    continue
                plan = build_plan(self.problem, pools, self.heuristic, tp_cap=cap,
                                  max_stages=self.options.max_stages, cache=self.pipelines,
                                  deadline=self.explore_deadline)
                self.found[(d, mode, cap)] = (self.price(plan), plan) if plan else (np.inf, None)

    def price(self, plan: Plan) -> float:
        start = time.perf_counter()
        t = iteration_time(self.problem, plan, check=False)
        self.price_s = max(self.price_s, time.perf_counter() - start)
        return t

    def caps(self) -> list[int | None]:
        """The secondary splits' TP caps, each held to `max_tp` (a cap of None: the limit itself)."""
        h = self.heuristic
        caps = [None] if h.fixed_tp is not None else list(h.tp_caps)
        if h.max_tp is None:
            return caps
        return list(dict.fromkeys(h.max_tp if c is None else min(c, h.max_tp) for c in caps))

    def ranked(self) -> list[tuple[tuple, float, Plan]]:
        found = [(k, t, p) for k, (t, p) in self.found.items() if p is not None]
        return sorted(found, key=lambda x: (x[1], x[0][0], str(x[0])))

    def explore(self, progress) -> None:
        """D over a coarse grid with the first secondary split, then D between the best one's
        neighbours, then the other secondary splits for the best few D."""
        upper = max_pipelines(self.problem, self.options)
        tried = list(self.heuristic.pipelines or sorted(set(coarse_candidates(upper, self.heuristic.max_d_candidates))
                                                         | set(aligned_candidates(self.problem, upper))))
        tried = [d for d in tried if 1 <= d <= upper] or [1]
        caps = self.caps()
        self.progress = progress
        task = progress.add_task("heuristic: D search", total=len(tried) + 9) if progress else None
        self.sweep(tried if self.heuristic.pipelines else anytime_order(self.problem, tried), caps[:1], progress, task)
        refined = (refine_candidates(self.ranked()[0][0][0], tried, upper)
                   if not self.heuristic.pipelines and self.ranked() else [])
        self.sweep(refined, caps[:1], progress, task)
        best_d = list(dict.fromkeys(k[0] for k, _, _ in self.ranked()))[: self.heuristic.polish_candidates]
        swept = len(tried) + len(refined) + len(best_d)  # the refinement's D are known now: the bar's length
        if progress:
            progress.update(task, total=swept)
        self.sweep(best_d, caps[1:], progress, task)
        if progress:  # done, or stopped at its share of the time limit: either way the phase is over
            progress.update(task, completed=swept)

    def sweep(self, ds: list[int], caps: list[int | None], progress, task) -> None:
        for d in ds:
            self.try_d(d, caps)
            if progress:
                progress.advance(task)

    def own_best(self) -> tuple[float, Plan] | None:
        """The best few structures polished, then (on clusters up to `move_devices`) improved by
        structure moves with more starts (`moved_starts`); the best plan found (the earliest on
        ties)."""
        starts = self.polished(self.start_plans())
        if not starts:
            return None
        if self.moves_on():
            starts = self.moved_starts(starts)
        t, _, plan = min(starts, key=lambda s: s[0])  # ties: the earlier start
        return t, plan

    def moved_starts(self, starts: list[tuple[float, int, Plan]]) -> list[tuple[float, int, Plan]]:
        """The first starts, each improved by structure moves; then, with the time left, the
        best structure of each of the best few D that they leave out, polished and moved with as
        much work each; then the `family_starts`, sharing one start's work; then the
        `next_starts`, sharing what the others left of the whole work. Every start moved, (T,
        index, plan)."""
        priced: dict = {}  # shapes priced once across the starts
        work = self.heuristic.evaluations_for(self.options.time_limit_s)
        share = work // self.heuristic.polish_candidates
        # the later starts depend on the structures found only, not on the moves: listed once
        other_plans, family_plans = self.other_d_starts(), self.family_starts()
        next_plans = self.next_starts(other_plans + family_plans)
        total = self.add_moves_bar(work, len(other_plans), bool(family_plans))
        starts = self.moved(starts, priced, work)
        # the best few are often one D's protect modes, and the moves from another D's structure
        # reach plans theirs do not (generated 64 GPUs seed 1: a D = 3 start ends as a D = 2 plan
        # of 6.210 s, the D = 2 starts at 6.289 s); after them, so that they keep their work and time
        others = self.polished(other_plans, every=False)
        if others:
            starts += self.moved(others, priced, len(priced) + share * len(others))
        # then one start's work, shared by the best structure of each other family of splits
        families = self.polished(family_plans, every=False)
        if families:
            starts += self.moved(families, priced, len(priced) + share)
        # last, the next few structures in rank order share what the starts above left of the
        # work (their moves end where no neighbour helps): on gen-40 seed 0 they reach a D = 4
        # plan of 5.758 s where the starts above end at 5.808 s
        nexts = self.polished(next_plans, every=False) if len(priced) < total else []
        if nexts:
            starts += self.moved(nexts, priced, total)
        self.moves_done(priced, final=True)
        return starts

    def add_moves_bar(self, work: int, other_starts: int, family_starts: bool) -> int:
        """The structure moves' whole work (shapes priced): the first starts' `work`, a start's
        share for each other D's start and one for the family starts; what they leave unspent goes
        to `next_starts`. A bar for it when progress is shown: moves that stop early (no
        neighbour helps, no next start) leave part of it unspent, and the bar then jumps."""
        share = work // self.heuristic.polish_candidates
        total = work + share * other_starts + (share if family_starts else 0)
        if self.progress is not None:
            self.moves_bar = (self.progress.add_task("heuristic: structure moves", total=total), total)
        return total

    def moves_done(self, priced: dict, final: bool = False) -> None:
        """The moves' bar at the shapes priced so far (full once the moves are over)."""
        if self.moves_bar is not None:
            task, total = self.moves_bar
            self.progress.update(task, completed=total if final else min(len(priced), total))

    def polished(self, plans: list[Plan], every: bool = True) -> list[tuple[float, int, Plan]]:
        """(T, index, plan) of each plan polished, until the polish deadline (the first is always
        polished when `every`)."""
        done = []
        for plan in plans:
            if (done or not every) and time.perf_counter() > self.polish_deadline:
                break
            plan = self.polish_one(plan)
            done.append((iteration_time(self.problem, plan, check=False), len(done), plan))
        return done

    def moved(self, starts: list[tuple[float, int, Plan]], priced: dict, work: int) -> list[tuple[float, int, Plan]]:
        """Each start improved by the structure moves, best first, each an equal share of what is
        left of `work` (shapes priced, counted in `priced`)."""
        deadline, improved = self.move_deadline(), []
        for i, (_, _, plan) in enumerate(sorted(starts, key=lambda s: (s[0], s[1]))):
            share = (work - len(priced)) // (len(starts) - i)
            plan = improve(self.problem, plan, polish=self.polish_one, deadline=deadline,
                           max_rounds=self.heuristic.move_rounds, max_stages=self.options.max_stages,
                           max_pipelines=self.options.max_pipelines, max_tp=self.heuristic.max_tp, priced=priced,
                           max_evaluations=share)
            self.moves_done(priced)
            improved.append((iteration_time(self.problem, plan, check=False), i, plan))
        return improved

    def start_plans(self) -> list[Plan]:
        """The hint first (its polish is the warm start's whole point, so the deadline never
        skips it), then the best few structures the search found."""
        found = start_choice.first_starts(self.ranked(), self.heuristic.polish_candidates)
        return ([self.hint] if self.hint is not None else []) + found

    def other_d_starts(self) -> list[Plan]:
        return start_choice.other_d_starts(self.ranked(), self.heuristic.polish_candidates)

    def family_starts(self) -> list[Plan]:
        return start_choice.family_starts(self.ranked(), self.heuristic.polish_candidates)

    def next_starts(self, later: list[Plan]) -> list[Plan]:
        return start_choice.next_starts(self.ranked(), self.heuristic.polish_candidates, later)

    def moves_on(self) -> bool:
        h = self.heuristic
        return h.is_plain and self.problem.cluster.num_devices <= h.move_devices and h.move_rounds > 0

    def move_deadline(self) -> float:
        """The structure moves may use the budget (their work is bounded by
        `evaluations_for`), less `reserve_share` of what is left (for a solver that follows
        this search, e.g. the composite's exact refinement)."""
        now = time.perf_counter()
        return now + (self.deadline - now) * (1 - self.reserve_share)

    def polish_one(self, plan: Plan) -> Plan:
        problem = self.problem
        table = stage_table(problem, plan)
        layers, micro, _ = polish(problem, table, rounds=self.heuristic.polish_rounds,
                                  exhaustive_moves=self.heuristic.exhaustive_moves, deadline=self.polish_deadline)
        final = with_split(table, layers, micro, problem.training.micro_batch)
        return plan_from_table(problem, plan, final)


def solve_with(problem: Problem, options: SolverOptions, heuristic: HeuristicOptions,
               name: str = "heuristic", *, reserve_share: float = 0.0) -> SolveResult:
    """The heuristic's own search (or one of its baseline/ablation settings, reported as
    `name`); its structure moves leave `reserve_share` of the time left to a follow-up."""
    search = Search(problem, options, heuristic, reserve_share)
    # elapsed, not rich's estimate of the time left: the moves often stop before their work limit;
    # on stderr, as the CLI's spinner: stdout may carry the plan's JSON
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    bar = terminal_progress(options, *columns)
    with bar or nullcontext() as progress:
        search.explore(progress)
        best = search.own_best()
    wall = time.perf_counter() - search.start
    if best is None:
        return _no_plan(problem, heuristic, name, wall)
    return plan_result(problem, name, *best, wall=wall)


def plan_result(problem: Problem, name: str, t: float, plan: Plan, *, wall: float,
                status: SolveStatus = SolveStatus.feasible, bound: float | None = None, note: str = "",
                restrictions: tuple[str, ...] = ()) -> SolveResult:
    """The result for a plan of T = `t` (checked by the validator first), `feasible` unless a
    proof says otherwise; its message sums the plan up, then `note`."""
    problems = validate(problem, plan)
    if problems:  # never expected: phase 2, the polish, the moves and CP-SAT keep every rule
        raise RuntimeError(f"heuristic built an invalid plan: {problems[0]}")
    info = SolverInfo(name=name, status=status, objective_s=t, bound_s=bound, wall_s=wall)
    message = (f"D={len(plan.pipelines)}, {plan.num_stages} stage{'s' if plan.num_stages != 1 else ''}, "
               f"{len(plan.devices)}/{plural(problem.cluster.num_devices, 'device')} used" + note)
    return SolveResult(solver=name, status=status, plan=plan.model_copy(update={"solver": info}),
                       objective_s=t, bound_s=bound, wall_s=wall, message=message, restrictions=restrictions)


def _no_plan(problem: Problem, heuristic: HeuristicOptions, name: str, wall: float) -> SolveResult:
    """No plan found. A heuristic proves nothing by failing: `infeasible` only with a proof —
    the exact solvers' own memory argument (the same message whichever solver finds it), or a
    fixed TP size no machine can form — else `unknown`."""
    proof = explain_infeasible(Tables(problem))
    t = heuristic.fixed_tp
    if not proof and t is not None:
        if t not in problem.model.tp_sizes(t):
            proof = (f"TP size {t} does not divide heads {problem.model.heads} and kv heads "
                     f"{problem.model.num_kv_heads}")
        elif max(m.count for m in problem.cluster.machines) < t:
            proof = f"no machine has {plural(t, 'device')} for a TP size of {t}"
    if proof:
        return SolveResult(solver=name, status=SolveStatus.infeasible, wall_s=wall, message=proof)
    return SolveResult(solver=name, status=SolveStatus.unknown, wall_s=wall,
                       message="the heuristic found no plan that fits in memory; that is no proof that "
                               "none exists (cpsat or milp can decide it)")


def solve(problem: Problem, options: SolverOptions) -> SolveResult:
    """The default heuristic's own search (the registry's `heuristic` adds the exact refinement
    on small clusters: solvers/layered/composed.py)."""
    return solve_with(problem, options, HeuristicOptions())
