"""The search loop: over D (pipelines) and the secondary split (TP cap), build a plan for
each candidate, keep the best few by the full evaluator, polish those and return the best.

Deterministic for a given seed (METIS and the random baseline take it; nothing reads global
random state). A rich progress bar shows on long runs; `SolverOptions.time_limit_s` bounds
the wall time (the first candidate always completes, so a plan comes back if one exists).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np
from rich.progress import Progress

from planner.layered.pricing import iteration_time
from planner import cost
from planner.layered.plan import Plan
from planner.solver_info import SolverInfo, SolveStatus
from planner.problem import Problem
from planner.layered.table import stage_table
from planner.layered.validate import validate
from solvers.common import SolveResult, SolverOptions
from solvers.layered.exact.tables import Tables, explain_infeasible
from solvers.layered.heuristic.assemble import build_plan, plan_from_table, with_split
from solvers.layered.heuristic.options import HeuristicOptions
from solvers.layered.heuristic.partition import partition
from solvers.layered.heuristic.polish import polish

SMALL_CLUSTER = 512  # up to this many devices "auto" protect tries both link weightings


def max_pipelines(problem: Problem, options: SolverOptions) -> int:
    """Upper bound on D: micro-batches, devices, and the memory to hold one model replica
    (model states only, μ·P, against the cluster's memory less the reserves)."""
    cluster, training = problem.cluster, problem.training
    by_memory = int(cost.usable_memory_bytes(cluster, training) // cost.model_state_bytes(problem.model, training))
    bound = min(training.micro_batches, cluster.num_devices, max(1, by_memory))
    return min(bound, options.max_pipelines or bound)


def coarse_candidates(upper: int, count: int) -> list[int]:
    """All D up to `upper` if few, else a geometric grid from 1 to `upper`."""
    if upper <= count:
        return list(range(1, upper + 1))
    grid = np.unique(np.rint(np.geomspace(1, upper, count)).astype(int))
    return [int(x) for x in grid]


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
    if heuristic.protect != "auto":
        return [heuristic.protect]
    if problem.cluster.num_devices <= SMALL_CLUSTER:
        return ["pipeline", "data"]
    return ["pipeline"]


class Search:
    def __init__(self, problem: Problem, options: SolverOptions, heuristic: HeuristicOptions):
        self.problem, self.options, self.heuristic = problem, options, heuristic
        self.start = time.perf_counter()
        self.deadline = self.start + options.time_limit_s
        self.found: dict[tuple, tuple[float, Plan]] = {}  # (D, mode, cap) -> (T, plan)
        self.seen_pools: dict[tuple, list] = {}
        self.pipelines: dict = {}  # phase-2 results by (pool, TP layout), shared by all candidates

    def out_of_time(self) -> bool:
        return bool(self.ranked()) and time.perf_counter() > self.deadline

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
            pools = self.pools(d, mode)
            signature = sorted(tuple(p.tolist()) for p in pools)
            if signature in done_pools:  # both modes gave the same split
                continue
            done_pools.append(signature)
            for cap in caps:
                if self.out_of_time() or (d, mode, cap) in self.found:
                    continue
                plan = build_plan(self.problem, pools, self.heuristic, tp_cap=cap,
                                  max_stages=self.options.max_stages, cache=self.pipelines)
                self.found[(d, mode, cap)] = (
                    (iteration_time(self.problem, plan, check=False), plan) if plan else (np.inf, None))

    def caps(self) -> list[int | None]:
        return [None] if self.heuristic.fixed_tp is not None else list(self.heuristic.tp_caps)

    def ranked(self) -> list[tuple[tuple, float, Plan]]:
        found = [(k, t, p) for k, (t, p) in self.found.items() if p is not None]
        return sorted(found, key=lambda x: (x[1], x[0][0], str(x[0])))

    def explore(self, progress) -> None:
        """D over a coarse grid with the first secondary split, then D between the best one's
        neighbours, then the other secondary splits for the best few D."""
        upper = max_pipelines(self.problem, self.options)
        tried = list(self.heuristic.pipelines or coarse_candidates(upper, self.heuristic.max_d_candidates))
        tried = [d for d in tried if 1 <= d <= upper] or [1]
        caps = self.caps()
        task = progress.add_task("heuristic: D search", total=len(tried) + 9) if progress else None
        self.sweep(tried, caps[:1], progress, task)
        if not self.heuristic.pipelines and self.ranked():
            self.sweep(refine_candidates(self.ranked()[0][0][0], tried, upper), caps[:1], progress, task)
        best_d = list(dict.fromkeys(k[0] for k, _, _ in self.ranked()))[: self.heuristic.polish_candidates]
        self.sweep(best_d, caps[1:], progress, task)

    def sweep(self, ds: list[int], caps: list[int | None], progress, task) -> None:
        for d in ds:
            self.try_d(d, caps)
            if progress:
                progress.advance(task)

    def polished(self) -> tuple[float, Plan] | None:
        best = None
        for _, _, plan in self.ranked()[: self.heuristic.polish_candidates]:
            plan = self.polish_one(plan)
            t = iteration_time(self.problem, plan, check=False)
            if best is None or t < best[0]:
                best = (t, plan)
        return best

    def polish_one(self, plan: Plan) -> Plan:
        problem = self.problem
        table = stage_table(problem, plan)
        layers, micro, _ = polish(problem, table, rounds=self.heuristic.polish_rounds,
                                  exhaustive_moves=self.heuristic.exhaustive_moves, deadline=self.deadline)
        final = with_split(table, layers, micro, problem.training.micro_batch)
        return plan_from_table(problem, plan, final)


def solve_with(problem: Problem, options: SolverOptions, heuristic: HeuristicOptions,
               name: str = "heuristic") -> SolveResult:
    """The heuristic (or one of its baseline/ablation settings, reported as `name`)."""
    search = Search(problem, options, heuristic)
    bar = Progress(transient=True) if options.progress else nullcontext()
    with bar as progress:
        search.explore(progress if options.progress else None)
        best = search.polished()
    wall = time.perf_counter() - search.start
    if best is None:
        return _no_plan(problem, heuristic, name, wall)
    t, plan = best
    problems = validate(problem, plan)
    if problems:  # never expected: phase 2 and the polish keep every rule
        raise RuntimeError(f"heuristic built an invalid plan: {problems[0]}")
    info = SolverInfo(name=name, status=SolveStatus.feasible, objective_s=t, wall_s=wall)
    return SolveResult(solver=name, status=SolveStatus.feasible, plan=plan.model_copy(update={"solver": info}),
                       objective_s=t, wall_s=wall,
                       message=f"D={len(plan.pipelines)}, {plan.num_stages} stage{'s' if plan.num_stages != 1 else ''}, "
                               f"{len(plan.devices)}/{problem.cluster.num_devices} devices used")


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
            proof = f"no machine has {t} devices for a TP size of {t}"
    if proof:
        return SolveResult(solver=name, status=SolveStatus.infeasible, wall_s=wall, message=proof)
    return SolveResult(solver=name, status=SolveStatus.unknown, wall_s=wall,
                       message="the heuristic found no plan that fits in memory; that is no proof that "
                               "none exists (cpsat or milp can decide it)")


def solve(problem: Problem, options: SolverOptions) -> SolveResult:
    return solve_with(problem, options, HeuristicOptions())
