"""The registry's `colgen` (layered plans): the default heuristic's plan, proved or bounded by
the configuration bound (docs/bounds.md), and on small clusters the exact CP-SAT search from
that plan with the time left.

1. The default heuristic's own search with the caller's options — the plan a user of
   `heuristic` gets (the same seed and time limit; it stops when its work is done), so this
   solver never returns a plan slower than it (issue 33).
2. The configuration bound over every D (`search.configuration_bound`) with a share of the
   time left; the incumbent is the first threshold. Plans read back from its usage tables
   (`plans.plans_from_bound`) replace the heuristic's when faster.
3. On clusters of at most EXACT_DEVICES devices, CP-SAT warm-started from the best plan with
   the rest of the time; its bound and plan are joined with the others.

The result's objective is `planner.evaluate`'s T of its plan; its bound is the larger of
the configuration bound and CP-SAT's (both are lower bounds on the optimum), never above T.
"""

from __future__ import annotations

import time

from planner.base import format_runs
from planner.layered.pricing import iteration_time
from planner.problem import Problem
from planner.solver_info import SolverInfo, SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.layered.bound.plans import plans_from_bound
from solvers.layered.bound.search import CertificateContradiction, ConfigurationBound, configuration_bound
from solvers.layered.heuristic import HeuristicOptions, solve_with as own_search
from solvers.layered.tables import Tables, explain_infeasible

NAME = "colgen"
EXACT_DEVICES = 16  # up to this many devices CP-SAT gets the time the bound leaves
BOUND_SHARE = 0.7  # of the time left after the heuristic, for the bound (the rest: CP-SAT)
LARGE_BOUND_SHARE = 0.9  # the same without CP-SAT (the rest: plans read back from the tables)
CLOSED = 1e-9  # relative: a bound this close to T proves the plan optimal
PLAN_SHARE = 0.5  # of the time after the bound's share, what reading plans back from its tables may take


def _unexamined(config: ConfigurationBound) -> str:
    """What the time limit left open, if anything: the D whose bisection it stopped."""
    if config.complete:
        return ""
    open_d = config.unfinished
    if not open_d:
        return " (not every D examined)"
    return (f" (not every D examined: D {format_runs(open_d)} stopped by the time limit; "
            "more time may raise the bound)")


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The heuristic's plan with a proven bound (and CP-SAT's improvement on small clusters)."""
    options = options or SolverOptions()
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    tables = Tables(problem)
    why = explain_infeasible(tables)
    if why:
        return SolveResult(solver=NAME, status=SolveStatus.infeasible, wall_s=time.perf_counter() - start, message=why)
    own = own_search(problem, options, HeuristicOptions())
    best_t = own.objective_s if own.plan is not None else None
    plan = own.plan.model_copy(update={"solver": None}) if own.plan is not None else None
    d_values = _d_values(tables, options)
    small = problem.cluster.num_devices <= EXACT_DEVICES
    bound_deadline = time.perf_counter() + (deadline - time.perf_counter()) * (BOUND_SHARE if small else LARGE_BOUND_SHARE)
    withheld = ""
    try:
        config = configuration_bound(tables, best_t, d_values, bound_deadline,
                                     first_d=len(plan.pipelines) if plan is not None else None)
    except CertificateContradiction as exc:  # never report a bound that a plan in hand disproves
        config, withheld = ConfigurationBound(floor=tables.trivial_bound), f" ({exc})"
    bound, notes = config.value, [f"configuration bound {config.value:.6g} s" + _unexamined(config) + withheld]
    read = plans_from_bound(problem, config, bound_deadline + PLAN_SHARE * (deadline - bound_deadline))
    if read and (best_t is None or iteration_time(problem, read[0]) < best_t):
        plan, best_t = read[0], iteration_time(problem, read[0])
        notes.append(f"plan from the usage tables: D={len(plan.pipelines)}")
    proven_infeasible = False
    if small and (best_t is None or bound < best_t * (1 - CLOSED)) and deadline - time.perf_counter() > 0.5:
        exact = _exact(problem, options, plan, deadline)
        if exact.plan is not None and (best_t is None or iteration_time(problem, exact.plan) < best_t):
            plan, best_t = exact.plan.model_copy(update={"solver": None}), iteration_time(problem, exact.plan)
        if exact.bound_s is not None:
            bound = max(bound, exact.bound_s)
        proven_infeasible = exact.status == SolveStatus.infeasible
        notes.append(f"cpsat {exact.status.value}" + (f", bound {exact.bound_s:.6g} s" if exact.bound_s else ""))
        if exact.status == SolveStatus.optimal and best_t is not None:
            bound = max(bound, best_t)
    return _result(problem, plan, best_t, bound, time.perf_counter() - start, notes, proven_infeasible,
                   restrictions=own.restrictions)


def _d_values(tables: Tables, options: SolverOptions) -> list[int]:
    """D = 1 … min(N, B/b), or the user's limit (then the bound holds under that limit only)."""
    top = tables.max_pipelines if options.max_pipelines is None else min(tables.max_pipelines, options.max_pipelines)
    return list(range(1, top + 1))


def _exact(problem: Problem, options: SolverOptions, plan, deadline: float) -> SolveResult:
    from solvers.layered.composed import solve_cpsat

    left = max(0.5, deadline - time.perf_counter())
    sub = SolverOptions(time_limit_s=left, threads=options.threads, seed=options.seed, hint=plan,
                        max_pipelines=options.max_pipelines, max_stages=options.max_stages)
    return solve_cpsat(problem, sub)


def _result(problem, plan, best_t, bound, wall, notes, proven_infeasible, restrictions) -> SolveResult:
    if plan is None:
        status = SolveStatus.infeasible if proven_infeasible else SolveStatus.unknown
        return SolveResult(solver=NAME, status=status, wall_s=wall, message="; ".join(notes))
    bound = min(bound, best_t)
    status = SolveStatus.optimal if bound >= best_t * (1 - CLOSED) else SolveStatus.feasible
    plan = plan.model_copy(update={"solver": SolverInfo(name=NAME, status=status, objective_s=best_t,
                                                         bound_s=bound, wall_s=wall)})
    return SolveResult(solver=NAME, status=status, plan=plan, objective_s=best_t, bound_s=bound, wall_s=wall,
                       restrictions=tuple(restrictions), message="; ".join(notes))
