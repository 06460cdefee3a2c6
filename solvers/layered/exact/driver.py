"""The outer loop both exact models share (docs/formulation.md §3): one model per number of
pipelines D, an incumbent that cuts the later models off, and an honest bound.

For each D the backend returns its best pipelines, its objective and a lower bound; the
plan is re-priced by `planner.evaluate`, and the result's objective is the evaluator's T.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from rich.console import Console

from planner.base import format_runs
from planner.layered.pricing import iteration_time
from planner.layered.plan import Plan
from planner.solver_info import SolverInfo, SolveStatus
from planner.prices import spendable
from planner.problem import Objective, Problem
from planner.layered.validate import validate
from solvers.common import ModelSize, SolveResult, SolverOptions
from solvers.layered.exact.bounds import DBounds, OutOfTime, PipelineFloors, ordered_structures, structures
from solvers.layered.tables import (PipelineSpec, Tables, build_plan, explain_infeasible, memory_summary,
                                          specs_of_plan)
from solvers.layered.exact.rent import over_budget
from solvers.layered.exact.subproblem import Backend, BuildStopped, SubProblem, SubResult
from solvers.layered.exact.warm_start import WarmStartFn, warm_start
from solvers.rental import least_rent_holding_states
from planner.base import plural

# relative tolerance between a model's objective and the evaluator's T (float rounding only)
MODEL_TOLERANCE = 1e-6


class ExactSolveError(RuntimeError):
    """A model's objective disagrees with the evaluator: a bug in the formulation."""


def solve_exact(problem: Problem, options: SolverOptions, name: str, backend: Backend,
                warm_start_fn: WarmStartFn | None = None) -> SolveResult:
    """The exact search with `backend`'s model per D, from the warm start (the hint, else
    `warm_start_fn`'s plan beyond tiny problems, else the symmetric baseline's)."""
    start = time.perf_counter()
    if problem.objective != Objective.time:
        raise ValueError(f"{name} minimizes T (under a budget): the cost objective is solved over the frontier "
                         f"(solvers.registry's {name}, solvers/objective.py)")
    tables = Tables(problem)
    log = _logger(options)
    why = unaffordable(problem) or explain_infeasible(tables)
    if why:
        return SolveResult(solver=name, status=SolveStatus.infeasible, wall_s=time.perf_counter() - start,
                           message=why)
    d_values, max_stages, restrictions = _limits(tables, options)
    best_t, best_plan, hint = warm_start(problem, options, log, warm_start_fn)
    setup = _Setup(problem=problem, name=name, backend=backend, tables=tables, options=options, log=log,
                   hint=hint, max_stages=max_stages)
    search = _Search(setup=setup, best_t=best_t, best_plan=best_plan)
    deadline = start + options.time_limit_s
    floors, open_d = _combinatorial_bounds(tables, d_values, best_t, deadline, log)
    proof = _prove(search, floors, open_d, deadline)
    return _result(search, proof, d_values=d_values, start=start, restrictions=restrictions)


def _limits(tables: Tables, options: SolverOptions) -> tuple[list[int], int, list[str]]:
    """The D values to solve, the most stages per pipeline, and the user's limits that may
    cut the optimum (reported as restrictions)."""
    d_values, restrictions = _pipeline_counts(tables, options)
    max_stages = min(tables.max_stages, options.max_stages or tables.max_stages)
    if options.max_stages and options.max_stages < tables.max_stages:
        restrictions.append(f"at most {options.max_stages} stage{'s' if options.max_stages != 1 else ''} per pipeline "
                            f"(a pipeline can have up to {tables.max_stages})")
    return d_values, max_stages, restrictions


@dataclass(frozen=True)
class _Proof:
    """What the outer loop established: the D proved, each D's bound, the D proved without a
    model (by the combinatorial bound alone)."""

    proven: set[int]
    bounds: dict[int, float]
    by_bound: list[int]
    stopped: list[str]  # why the search stopped before every D was proved


def _prove(search: _Search, floors: _Floors, open_d: list[int], deadline: float) -> _Proof:
    """Solve the open D in search order, each with its share of the time left; a D whose
    floor reaches a later incumbent is proved without its model. D left unproven (their
    models stopped at their share) are solved again, from the best plan, in further passes
    while time is left: the budget is used unless every D is proved."""
    tables = search.setup.tables
    by_bound = [d for d in floors if d not in open_d]  # D proved without a model
    proof = _Proof(proven=set(by_bound), bounds={d: _initial_bound(floors[d], tables, search.best_t) for d in floors},
                   by_bound=by_bound, stopped=[])
    todo = _search_order(open_d, search.setup.hint)
    while todo and deadline - time.perf_counter() > 0.05:
        ran = _pass(search, floors, todo, deadline, proof)
        todo = [d for d in todo if d not in proof.proven]
        if not ran:  # nothing could run (every open D too big to build in the time left)
            break
    if todo:
        proof.stopped[:] = [proof.stopped[-1] if proof.stopped else "the time limit was reached"]
    proof.by_bound.sort()
    return proof


def _seconds(x: float) -> str:
    """A build time as the note says it: '0.3 s', '12 s' (":.0f" printed a 0.3 s build as "about 0 s")."""
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


def _pass(search: _Search, floors: _Floors, todo: list[int], deadline: float, proof: _Proof) -> int:
    """One pass over the D still open; returns how many models it built. The D passed over (too
    big to build, or too little time for a model) are logged once per reason, as ranges: the
    96-GPU offers problem printed 200 lines "D=k: open" at -t 5, one per D per pass."""
    log, ran, passed_over = search.setup.log, 0, {}
    for i, d in enumerate(todo):
        left = deadline - time.perf_counter()
        if left <= 0.05:
            proof.stopped.append("the time limit was reached")
            break
        if search.best_t is not None and floors[d] >= search.best_t:  # a later model found a better incumbent
            proof.proven.add(d)
            continue
        if search.build_rate * d > left:  # this model could not even be built in time: leave D open
            proof.stopped.append(f"building the model for D={d} would take about {_seconds(search.build_rate * d)}, "
                                 f"{_seconds(left)} were left")
            passed_over.setdefault("skipped, building the model would take longer than the time left", []).append(d)
            continue
        done, d_bound, models = search.run(d, floors[d], floors.per_d[d], left / (len(todo) - i))
        ran += models  # a pass that built nothing ends the passes: the next would not either
        best = search.best_t
        if done:
            proof.proven.add(d)
            proof.by_bound.extend([] if models else [d])
        d_bound = d_bound if d_bound < float("inf") or best is None else best
        bound = max(d_bound, min(floors[d], best or floors[d]))
        # every pass's bound is a true lower bound for D: keep the largest (at most the incumbent)
        proof.bounds[d] = bound if done else min(max(bound, proof.bounds.get(d, 0.0)), best or float("inf"))
        if d in search.stopped_builds:
            proof.stopped.append(f"building the model for D={d} stopped at its share of the time")
            passed_over.setdefault("open, building the model stopped at its share of the time", []).append(d)
            continue
        if not done and not models:
            passed_over.setdefault("open, too little time left for a model this pass", []).append(d)
            continue
        log(f"D={d}: " + ("proved" if done else "open") + (f", bound {proof.bounds[d]:.6g} s"
                                                           if proof.bounds[d] != float("inf") else ""))
    for reason, ds in passed_over.items():
        log(f"D in {format_runs(sorted(ds))}: {reason}")
    return ran


def _initial_bound(floor: float, tables: Tables, best_t: float | None) -> float:
    """A D left unfinished keeps its combinatorial bound (at least the trivial one, at most
    the incumbent)."""
    bound = max(floor, tables.trivial_bound)
    return bound if best_t is None else min(bound, best_t)


STRUCTURE_LIMIT = 24  # beyond this many structures [B4], one model covers the whole D


@dataclass(frozen=True, kw_only=True)
class _Setup:
    """What every model of one solve shares, read-only."""

    problem: Problem
    name: str
    backend: Backend
    tables: Tables
    options: SolverOptions
    log: Callable[[str], None]
    hint: list[PipelineSpec] | None
    max_stages: int


@dataclass(kw_only=True)
class _Search:
    """The state one D's models share with the outer loop: the incumbent and the sizes."""

    setup: _Setup
    best_t: float | None = None
    best_plan: Plan | None = None
    size: ModelSize = field(default_factory=lambda: ModelSize(variables=0, constraints=0))
    error: float = 0.0  # the largest model-vs-true-T rounding bound of the models run
    build_rate: float = 0.0  # seconds of model building per pipeline, last measured
    stopped_builds: set[int] = field(default_factory=set)  # D whose build reached its share of the time

    def run(self, d: int, floor: float, floors: PipelineFloors | None, share: float) -> tuple[bool, float, int]:
        """Solve D: one model per structure [B4]/[B5] (or one for all). Returns (proved, the
        least bound over the structures, models built)."""
        jobs = _structures(floors, d, self.best_t, self.setup.log)
        d_start = time.perf_counter()
        d_bound, done, models = float("inf"), True, 0
        for j, combo in enumerate(jobs):
            combo_floor = max([floor] + [c.floor for c in combo or ()])
            if combo is not None and self.best_t is not None and combo_floor >= self.best_t:
                d_bound = min(d_bound, self.best_t)  # a better incumbent came from an earlier model
                continue
            budget = (share - (time.perf_counter() - d_start)) / (len(jobs) - j)
            if budget <= 0.05:
                done, d_bound = False, min(d_bound, combo_floor)
                continue
            sub = self._solve(d, budget=budget, lower=combo_floor, floors=floors, combo=combo)
            models += 1
            done = done and sub.status in ("optimal", "infeasible")
            d_bound = min(d_bound, max(_sub_bound(sub, self.best_t, self.setup.tables), combo_floor))
            if d not in self.stopped_builds:  # _pass logs the stopped builds together
                self.setup.log(f"D={d}" + (f", structure {j + 1}/{len(jobs)}" if combo else "") + f": {sub.status}")
        return done, d_bound, models

    def _solve(self, d: int, *, budget: float, lower: float, floors, combo) -> SubResult:
        setup = self.setup
        hint = setup.hint if setup.hint and len(setup.hint) == d else None
        if self.best_plan is not None and len(self.best_plan.pipelines) == d:  # the best plan so far
            hint = specs_of_plan(setup.problem, self.best_plan)
        started = time.perf_counter()
        try:
            sub = setup.backend(SubProblem(
                tables=setup.tables, pipelines=d, options=setup.options, time_limit=budget, cutoff=self.best_t,
                hint=hint, max_stages=min(setup.max_stages, setup.tables.num_devices - d + 1), log=setup.log,
                lower_bound=lower, floors=floors, structure=combo, build_deadline=started + budget))
            self.stopped_builds.discard(d)
        except BuildStopped:  # its build rate so far (a lower bound) keeps larger D from starting
            sub = SubResult(status="unknown", build_s=time.perf_counter() - started)
            self.stopped_builds.add(d)
        self._record(d, sub, partial=d in self.stopped_builds)
        return sub

    def _record(self, d: int, sub: SubResult, partial: bool = False) -> None:
        """Keep the model's size, rounding bound and build rate (a `partial` build's is a lower
        bound: it never lowers one measured); price its plan, keep the best."""
        self.build_rate = max(self.build_rate, sub.build_s / d) if partial else sub.build_s / d
        self.size = ModelSize(variables=max(self.size.variables, sub.variables),
                              constraints=max(self.size.constraints, sub.constraints))
        self.error = max(self.error, sub.error_bound)
        if sub.specs is not None:
            plan, t = _priced(self.setup.problem, sub, self.setup.name)
            if self.best_t is None or t < self.best_t:
                self.best_t, self.best_plan = t, plan
                self.setup.log(f"D={d}: new best T = {t:.6g} s")


def _structures(floors: PipelineFloors | None, d: int, best_t: float | None, log) -> list:
    """[B4] The structures a D's plans below the incumbent must have, one model each; [None]
    (one model over everything) without an incumbent or when there are too many."""
    if floors is None or best_t is None:
        return [None]
    combos = structures(floors, d, best_t, STRUCTURE_LIMIT)
    if combos is None:
        return [None]
    combos = [combo for combo in combos if affordable(floors.tb, combo)]  # [C17]/[M18] would refuse the rest
    ordered = ordered_structures(floors, combos, best_t, STRUCTURE_LIMIT)
    log(f"D={d}: {len(combos)} structure(s) can beat the incumbent"
        + (f", {len(ordered)} with their stage orders" if ordered is not None else ""))
    return combos if ordered is None else ordered


class _Floors(dict):
    """D → combinatorial bound, with the per-D pipeline floors the models use as cuts."""

    per_d: dict


def _combinatorial_bounds(tables, d_values, best_t, deadline, log) -> tuple[_Floors, list[int]]:
    """[B2] for every D; a D whose bound reaches the incumbent (or where no D pipelines fit)
    is proved here, the others are left to the models (returned in order)."""
    d_bounds, floors = DBounds(tables), _Floors()
    floors.per_d = {}
    affordable = d_bounds.plain.affordable(deadline - time.perf_counter())
    if not affordable:
        log("too many stage-type multisets for the combinatorial bounds in the time given: models only")
    took: list[float] = []  # seconds per D: the tabulation grows with D, so predict the next
    for d in d_values if affordable else ():
        left = deadline - time.perf_counter()
        guess = took[-1] * max(2.0, took[-1] / took[-2]) if len(took) >= 2 else 0.0
        if left <= 0 or guess > left:
            log(f"D≥{d}: combinatorial bounds skipped" + (f" (the next would take about {_seconds(guess)})"
                                                         if left > 0 else "") + ": models only")
            break
        started = time.perf_counter()
        try:
            floors[d] = d_bounds.bound(d, deadline)
        except OutOfTime:
            log(f"D≥{d}: combinatorial bounds stopped by the time limit: models only")
            break
        took.append(max(time.perf_counter() - started, 1e-3))
        floors.per_d[d] = d_bounds.floors_for(d)
        done = floors[d] == float("inf") or (best_t is not None and floors[d] >= best_t)
        log(f"D={d}: combinatorial bound {floors[d]:.6g} s" + (" — cannot beat the incumbent" if done else ""))
    open_d = [d for d in floors if not (floors[d] == float("inf") or (best_t is not None and floors[d] >= best_t))]
    open_d += [d for d in d_values if d not in floors]
    for d in open_d:
        floors.setdefault(d, 0.0)
        floors.per_d.setdefault(d, None)
    return floors, open_d


def _search_order(d_values: list[int], hint: list | None) -> list[int]:
    """The warm start's D first, then outwards: the likeliest optimum gets time first, and
    its cutoff prunes the others."""
    centre = len(hint) if hint else 1
    return sorted(d_values, key=lambda d: (abs(d - centre), d))


def solver_time(sub: SubProblem, build_start: float) -> float:
    """What is left of a sub-problem's time after building its model (at least 0.1 s)."""
    return max(0.1, sub.time_limit - (time.perf_counter() - build_start))


def _pipeline_counts(tables: Tables, options: SolverOptions) -> tuple[list[int], list[str]]:
    top = tables.max_pipelines
    if options.max_pipelines and options.max_pipelines < top:
        return list(range(1, options.max_pipelines + 1)), [
            f"at most {plural(options.max_pipelines, 'pipeline')} (the problem allows up to {top})"]
    return list(range(1, top + 1)), []


def _priced(problem: Problem, sub: SubResult, name: str) -> tuple[Plan, float]:
    """Build the plan, check it with the validator and re-price it with the evaluator."""
    plan = build_plan(problem, sub.specs)
    violations = validate(problem, plan)
    if violations:
        raise ExactSolveError(f"{name} returned an invalid plan: " + "; ".join(map(str, violations)))
    if over_budget(problem, plan):
        raise ExactSolveError(f"{name} returned a plan over the budget: {over_budget(problem, plan)}")
    t = iteration_time(problem, plan)
    # the model may round T down by at most error_bound; at optimality it must not overestimate
    under = t - sub.objective > MODEL_TOLERANCE * t + sub.error_bound
    over = sub.status == "optimal" and sub.objective - t > MODEL_TOLERANCE * t
    if under or over:
        raise ExactSolveError(f"{name}: model objective {sub.objective!r} s != evaluator T {t!r} s "
                              f"(allowed error {sub.error_bound:.3g} s)")
    return plan, t


def _sub_bound(sub: SubResult, best_t: float | None, tables: Tables) -> float:
    if sub.status == "infeasible":
        return best_t if best_t is not None else float("inf")  # nothing at or below the cutoff
    bound = sub.bound if sub.bound is not None else tables.trivial_bound
    return max(bound, tables.trivial_bound)


def _result(search: _Search, proof: _Proof, *, d_values: list[int], start: float,
            restrictions: list[str]) -> SolveResult:
    name, tables = search.setup.name, search.setup.tables
    wall = time.perf_counter() - start
    bound = min(proof.bounds.get(d, tables.trivial_bound) for d in d_values)
    all_proven = len(proof.proven) == len(d_values)
    if search.best_plan is None:
        status = SolveStatus.infeasible if all_proven else SolveStatus.unknown
        message = (_no_plan_proved(search.setup.problem, tables) if all_proven
                   else "no plan found within the time limit" + (f" ({proof.stopped[-1]})" if proof.stopped else ""))
        return SolveResult(solver=name, status=status, wall_s=wall, model_size=search.size,
                           bound_s=None if all_proven else bound,
                           restrictions=tuple(restrictions), message=message)
    best_t, bound = search.best_t, min(bound, search.best_t)
    status = SolveStatus.optimal if all_proven else SolveStatus.feasible
    message = _message(search.error, proof.by_bound, [d for d in d_values if d not in proof.proven], proof.stopped)
    plan = search.best_plan.model_copy(update={"solver": SolverInfo(
        name=name, status=status, objective_s=best_t, bound_s=bound, wall_s=wall)})
    return SolveResult(solver=name, status=status, plan=plan, objective_s=best_t, bound_s=bound,
                       wall_s=wall, model_size=search.size, restrictions=tuple(restrictions), message=message)


def unaffordable(problem: Problem) -> str:
    """Why no plan fits the budget, when no machine set within it can hold the model states."""
    budget = problem.budget_per_hour
    if budget is None:
        return ""
    try:
        least = least_rent_holding_states(problem, exact=True)
    except ValueError:  # too many machine sets to decide it here: the models will
        return ""
    if least is not None and least <= spendable(budget):
        return ""
    return (f"no plan within the budget of {budget:g} per hour: no machine set it rents has the memory for the "
            f"model states" + (f" (the cheapest that has rents {least:g} per hour)" if least is not None else ""))


def affordable(tables: Tables, combo) -> bool:
    """Whether a structure [B4] rents machines within the budget (always without one)."""
    if tables.budget is None:
        return True
    used = np.flatnonzero(np.sum([c.shape.usage for c in combo], axis=0))
    return bool(tables.cluster.machine_rent[used].sum() <= spendable(tables.budget))


def _no_plan_proved(problem: Problem, tables: Tables) -> str:
    if problem.budget_per_hour is not None:
        return f"no plan within the budget of {problem.budget_per_hour:g} per hour (proved by the model)"
    return f"no plan fits in memory (proved by the model): {memory_summary(tables)}"


def _message(error: float, by_bound: list[int], open_d: list[int], stopped: list[str] = ()) -> str:
    """The rounding bound, the D proved by the combinatorial bound, the D left open and why."""
    parts = [f"time in integer units: model T within {error:.3g} s of the true T"] if error else []
    if by_bound:
        parts.append(f"D in {format_runs(by_bound)} proved by the combinatorial bound")
    if open_d:
        parts.append(f"not proven for D in {format_runs(open_d)}" + (f" ({stopped[-1]})" if stopped else ""))
    return "; ".join(parts)


def _logger(options: SolverOptions) -> Callable[[str], None]:
    if not options.progress:
        return lambda s: None
    console = Console(stderr=True)
    start = time.perf_counter()
    return lambda s: console.print(f"[dim]{time.perf_counter() - start:7.1f}s[/] {s}", highlight=False)
