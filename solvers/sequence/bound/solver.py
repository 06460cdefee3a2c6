"""The `bound` solver of sequence plans: a proven bound and a plan that meet at any size the
keys can be listed (docs/sequence_bounds.md §4).

1. The default heuristic's plan is the incumbent: nothing worse is ever returned.
2. Every key gets its lower bound on T_mb (`keys`, [K1]–[K4]).
3. Rounds: the configuration bound (`master`, [C1]–[C4]) finds the least configuration below
   the incumbent; each of its keys not met before gets a ring (`rings`: the exact MILP's on
   small keys, whose proven T_mb then replaces the key's bound, else the heuristic's on the
   key's devices); when every key of the configuration has a ring, the configuration is
   built as a plan, priced by the planner, and kept if faster. Rounds end when the least
   configuration's keys all have rings, none lies below the incumbent, or time runs out.
The bound returned is the least configuration's value (the incumbent when none is below it):
optimal when it meets the plan's T.
"""

from __future__ import annotations

import math
import time

import numpy as np

from planner.base import plural
from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.sequence import heuristic
from solvers.sequence.bound.keys import MAX_KEYS, key_bounds, key_count
from solvers.sequence.bound.master import Columns, Master
from solvers.sequence.bound.rings import KeyRing, place, ring_of
from planner.sequence.rules import no_token_layout
from solvers.sequence.space import memory_proof, plan_time, result, split_batches

NAME = "bound"
HEURISTIC_SHARE = 0.25  # of the time limit: the default heuristic's incumbent
OPTIMAL_TOL = 1e-9  # relative: a bound this close to T proves the plan optimal


def rings_of_plan(plan) -> tuple[list[int], list]:
    return [r.batch for r in plan.replicas], plan.rings()


class Search:
    """The rounds of step 3: keys, their bounds ℓ (raised where a ring is exact), the rings met."""

    def __init__(self, problem: Problem, options: SolverOptions, deadline: float):
        self.problem, self.options, self.deadline = problem, options, deadline
        bounds = key_bounds(problem)
        self.keys, self.ell = bounds.keys, bounds.bound_s.copy()
        self.index = {tuple(k): i for i, k in enumerate(self.keys.tolist())}
        self.known: dict[tuple, KeyRing] = {}
        self.incumbent: tuple[float, list[int], list] | None = None
        self.bound, self.complete, self.rounds, self.nodes = 0.0, False, 0, 0

    def run(self, incumbent) -> None:
        self.incumbent = incumbent
        while time.perf_counter() < self.deadline:
            self.rounds += 1
            finite = np.isfinite(self.ell)
            columns = Columns.of(self.problem, self.keys[finite], self.ell[finite])
            cutoff = self.incumbent[0] if self.incumbent else math.inf
            res = Master(self.problem, columns).solve(cutoff, self.deadline)
            self.bound, self.complete, self.nodes = res.bound_s, res.complete, self.nodes + res.nodes
            if res.best is None or not res.complete:
                return
            chosen = [tuple(columns.keys[i].tolist()) for i in res.best[1]]
            fresh = [k for k in dict.fromkeys(chosen) if k not in self.known]
            if not fresh:
                return
            for key in fresh:
                self.learn(key)
            self.build(chosen)

    def learn(self, key: tuple) -> None:
        found = ring_of(self.problem, key, self.deadline, self.options)
        self.known[key] = found
        if found.exact:
            i = self.index[key]
            self.ell[i] = max(self.ell[i], found.bound_s)

    def build(self, chosen: list[tuple]) -> None:
        """The configuration as a plan, when every key has a ring; kept if faster."""
        found = [self.known[k] for k in chosen]
        if any(f.ring is None for f in found):
            return
        m = split_batches(self.problem.training.global_batch // self.problem.training.micro_batch,
                          [f.tmb for f in found])
        batches = [x * self.problem.training.micro_batch for x in m]
        rings = place(self.problem, chosen, [f.ring for f in found])
        t, fits = plan_time(self.problem, batches, rings)
        if fits and (self.incumbent is None or t < self.incumbent[0]):
            self.incumbent = (t, batches, rings)

    def note(self, start_s: float | None, start_message: str) -> str:
        exact = sum(k.exact for k in self.known.values())
        heur = ("no heuristic plan" if start_s is None  # the start: the plan returned may be faster
                else f"started from the heuristic's plan of {start_s:.6g} s ({start_message})")
        return (f"{heur}; bound over {plural(len(self.keys), 'device set')} per machine, "
                f"{plural(self.rounds, 'round')}, {plural(self.nodes, 'configuration node')}; "
                f"rings of {plural(len(self.known), 'key')} ({exact} exact)"
                + ("" if self.complete else "; time ran out in the configuration bound"))


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The heuristic's plan, improved and bounded by the configuration bound (module docstring)."""
    options = options or SolverOptions()
    start = time.perf_counter()
    if (why := memory_proof(problem) or no_token_layout(problem)) is not None:
        return result(NAME, problem, start, None, SolveStatus.infeasible, why)
    # where the keys cannot be listed there is no bound to share the time with: the heuristic
    # gets all of it (with a quarter, 1,024 GPUs returned a plan 3.7 % slower than its own)
    share = HEURISTIC_SHARE if key_count(problem) <= MAX_KEYS else 1.0
    heur = heuristic.solve(problem, options.model_copy(update={"time_limit_s": options.time_limit_s * share}))
    return improve(problem, options, heur, start, name=NAME)


def improve(problem: Problem, options: SolverOptions, start_result: SolveResult, start: float, *,
            name: str) -> SolveResult:
    """Steps 2 and 3 from `start_result`'s plan (the incumbent) until `start` + the time limit:
    the better plan and the bound, under the solver name `name`. Where the keys cannot be
    listed (`keys.MAX_KEYS`), `start_result`'s plan with the reason."""
    incumbent = None if start_result.plan is None else (start_result.objective_s, *rings_of_plan(start_result.plan))
    try:
        search = Search(problem, options, start + options.time_limit_s)
    except ValueError as too_many:
        status = SolveStatus.feasible if incumbent else SolveStatus.unknown
        return result(name, problem, start, incumbent, status, f"{start_result.message}; no bound: {too_many}")
    search.run(incumbent)
    return _finish(problem, start, search, start_result, name)


def _finish(problem: Problem, start: float, search: Search, start_result: SolveResult, name: str) -> SolveResult:
    best, note = search.incumbent, search.note(start_result.objective_s, start_result.message)
    if best is None:
        status = SolveStatus.infeasible if search.complete else SolveStatus.unknown
        return result(name, problem, start, None, status, f"no configuration of replicas fits in memory; {note}")
    bound = min(search.bound, best[0])
    optimal = search.complete and bound >= best[0] * (1 - OPTIMAL_TOL)
    return result(name, problem, start, best, SolveStatus.optimal if optimal else SolveStatus.feasible, note,
                  bound=bound)
