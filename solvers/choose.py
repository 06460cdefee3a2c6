"""Which plan kind a problem is solved in, and `solve(problem, solver, kind="auto")` (the API's
`hexiscale.solve`; `hexiscale solve` chooses the same way).

An explicit kind always wins. `auto` chooses by the objective: every kind that has the solver is
solved within the one time limit and the faster plan is kept (under objective cost, the cheaper
per token), the reason saying both figures. Which
kind is *expected* to win follows the sequence length: each kind says from which seq_len on it
is preferred (`SolverKind.auto_from_seq_len`: sequence plans from
`solvers.sequence.LONG_CONTEXT_TOKENS` on, where activations and s² attention dominate,
docs/sequence-plans.md §7). The other kinds are solved first, within OTHERS_SHARE of the limit,
and the preferred kind last, with all the time they leave: the kind that usually wins gets at
least half of the limit, and all of it less the seconds the others took (the sequence heuristic
on a 64-GPU cluster at 4K tokens stops after 0.4 s, which leaves the layered search 59.6 s of
60). No threshold skips a kind: none of them can prove that the other kind cannot win.
`choose_kind` names the preferred kind (what `compare` compares in).
"""

from __future__ import annotations

import time

from planner.base import format_seconds
from planner.kinds import evaluate, kind_of
from planner.prices import objective_value
from planner.problem import Objective, Problem
from solvers.common import SolveResult, SolverOptions
from solvers.kinds import SOLVER_KINDS
from solvers.registry import SOLVERS_BY_KIND
from solvers.registry import solve as solve_in_kind

AUTO_KIND = "auto"


def choose_kind(problem: Problem, kind: str = AUTO_KIND, solver: str | None = None) -> tuple[str, str]:
    """The plan kind to solve `problem` in, and why ("" for an explicit kind); see the module text."""
    if kind != AUTO_KIND:
        return kind, ""
    having = [k for k, entries in SOLVERS_BY_KIND.items() if solver in entries]
    if solver is not None and len(having) == 1:
        return having[0], f"only {having[0]} plans have solver {solver!r}"
    return kind_for_seq_len(problem.training.seq_len)


def kind_for_seq_len(seq_len: int) -> tuple[str, str]:
    """The kind with the largest `auto_from_seq_len` at or below `seq_len`, and why: the bound it
    passed (and the kind below it) and the next kind's bound it stays under."""
    ladder = sorted(SOLVER_KINDS.values(), key=lambda k: k.auto_from_seq_len)
    i = max((j for j, k in enumerate(ladder) if k.auto_from_seq_len <= seq_len), default=0)
    reasons = []
    if i > 0:
        below = ladder[i - 1].name
        reasons.append(f"seq_len {seq_len:,} ≥ {ladder[i].auto_from_seq_len:,} tokens is long context; "
                       f"pass --kind {below} for a {below} plan")
    if i + 1 < len(ladder):
        reasons.append(f"seq_len {seq_len:,} < {ladder[i + 1].auto_from_seq_len:,} tokens")
    return ladder[i].name, "--kind auto: " + "; ".join(reasons)


OTHERS_SHARE = 0.5  # of the time limit, at most, for the kinds not preferred; the rest (and what they left) for it
MIN_KIND_S = 0.05  # a kind always gets this much, even when the time is spent


def solve(problem: Problem, solver: str = "heuristic", options: SolverOptions | None = None, *,
          kind: str = AUTO_KIND) -> SolveResult:
    """Run one registered solver in `kind`; `auto` solves every kind that has the solver within
    the one time limit and keeps the better plan by the objective (`kind_reason` says why,
    `kinds_tried` has each kind's T, or its cost per million tokens under objective cost)."""
    options = options or SolverOptions()
    preferred, why = choose_kind(problem, kind, solver)
    others = ([k for k in SOLVERS_BY_KIND if k != preferred and solver in SOLVERS_BY_KIND[k]]
              if kind == AUTO_KIND else [])
    kinds = others + [preferred]
    if len(kinds) == 1:
        return with_prices(problem, _registered(solve_in_kind(problem, solver, options, kind=preferred), solver,
                                                preferred).model_copy(update={"kind_reason": why}))
    return with_prices(problem, _fastest_of(problem, solver, options, kinds))


def _registered(result: SolveResult, solver: str, kind: str) -> SolveResult:
    """The result under its solver's registered name: a budget that no machine set meets is answered
    before any solver runs, under the function's name (`solve_heuristic`: solvers/objective.py
    wraps functions, and cannot import the registry, whose solvers import it)."""
    return result if result.solver in SOLVERS_BY_KIND[kind] else result.model_copy(update={"solver": solver})


def with_prices(problem: Problem, result: SolveResult) -> SolveResult:
    """The result with its plan's rent per hour and cost per million tokens, when the cluster
    has prices and a plan was found (docs/prices.md §13)."""
    if result.plan is None or not problem.cluster.priced:
        return result
    estimate = evaluate(problem, result.plan)
    return result.model_copy(update={"rent_per_hour": estimate.rent_per_hour,
                                     "cost_per_mtok": estimate.cost_per_mtok})


def _fastest_of(problem: Problem, solver: str, options: SolverOptions, kinds: list[str]) -> SolveResult:
    """Each kind solved in turn, the preferred one (`kinds[-1]`) last: the others share
    OTHERS_SHARE of the limit, the preferred one gets what is left. The result best by the
    objective: the smallest T, or cost per token under objective cost (the preferred kind's when
    none has a plan); `kinds_tried` holds each kind's figure of it."""
    start, results = time.perf_counter(), {}
    others_end = options.time_limit_s * OTHERS_SHARE
    for i, name in enumerate(kinds):
        spent = time.perf_counter() - start
        last = i == len(kinds) - 1
        budget = max(MIN_KIND_S, options.time_limit_s - spent if last
                     else (others_end - spent) / (len(kinds) - 1 - i))
        hint = options.hint if options.hint is not None and kind_of(options.hint).name == name else None
        results[name] = _registered(solve_in_kind(problem, solver, options.model_copy(
            update={"time_limit_s": budget, "hint": hint}), kind=name), solver, name)
    results = {name: results[name] for name in kinds[::-1]}  # reported preferred kind first
    # the objective's figure: T, or the cost per token under objective cost (docs/prices.md §13)
    tried = {name: objective_value(problem, r.plan, r.objective_s) if r.plan is not None else None
             for name, r in results.items()}
    found = [name for name in results if tried[name] is not None]  # a tie goes to the preferred kind
    best = min(found, key=lambda name: tried[name]) if found else kinds[-1]
    return results[best].model_copy(update={"kind_reason": _reason(problem, best, results, tried),
                                            "kinds_tried": tried})


def _reason(problem: Problem, best: str, results: dict[str, SolveResult], tried: dict[str, float | None]) -> str:
    """'--kind auto: solved every kind (sequence 9.05 s, layered 10.61 s); sequence is 1.17× faster', or
    under objective cost by the cost per million tokens ('… is 1.3× cheaper per token'): the figure the
    choice was made by."""
    cost = problem.objective == Objective.cost

    def figure(name: str, r: SolveResult) -> str:
        if r.plan is None:  # with its reason: 'infeasible' alone sent users to --kind to learn why
            return f"{name}: no plan ({r.status.value}{': ' + r.message if r.message else ''})"
        if cost:
            return f"{name} ${tried[name]:.4g} per Mtok (T {format_seconds(r.objective_s)})"
        return f"{name} {format_seconds(r.objective_s)}"
    listed = ", ".join(figure(name, r) for name, r in results.items())
    others = [tried[name] for name in results if name != best and tried[name] is not None]
    if results[best].plan is None:
        return f"--kind auto: solved every kind ({listed}); none found a plan"
    if not others:
        return f"--kind auto: solved every kind ({listed}); only {best} plans were found"
    if tried[best] == 0:  # free machines under objective cost: every plan costs $0 per Mtok
        return f"--kind auto: solved every kind ({listed}); {best} is as cheap (free) and kept"
    ratio = min(others) / tried[best]
    if ratio <= 1 + 1e-9:  # one plan priced alike in both kinds (one device): the preferred kind is kept
        return f"--kind auto: solved every kind ({listed}); they tie, and the sequence length prefers {best}"
    better = "cheaper per token" if cost else "faster"
    return f"--kind auto: solved every kind ({listed}); {best} is {ratio:.3g}× {better}"
