"""Every solver path by plan kind and name: `solve(problem, solver="...", kind="...")` and the
CLI reach them here.

Each plan kind (a folder of `planner/` and of `solvers/`) lists its own solvers; entries are
"module:function" strings imported on first use, so that asking for the heuristic never
imports OR-Tools or torch. The strings are still dependencies: tests/test_architecture.py
reads them as import edges of this module, and finds no cycle through them.
"""

from __future__ import annotations

import importlib
from typing import Callable

from planner.kinds import PLAN_KINDS
from planner.problem import Problem
from planner.solver_info import SolveStatus
from solvers.common import SolveResult, SolverOptions
from solvers.objective import honouring

SolverFn = Callable[[Problem, SolverOptions], SolveResult]
DEFAULT_KIND = "layered"

SOLVERS_BY_KIND: dict[str, dict[str, str]] = {
    # plan kind -> solver name -> "module:function"
    "layered": {
        # the heuristic with its exact refinement, and the exact models warm-started from the
        # heuristic: composed above both, which never import each other (composed.py)
        "heuristic": "solvers.layered.composed:solve_heuristic",
        "cpsat": "solvers.layered.composed:solve_cpsat",
        "milp": "solvers.layered.composed:solve_milp",
        "brute": "solvers.layered.exact.brute:solve",
        # the heuristic's plan with the configuration bound (docs/bounds.md), CP-SAT on small clusters
        "colgen": "solvers.layered.bound.solver:solve",
        "symmetric": "solvers.layered.baselines.symmetric:solve_symmetric",
        "symmetric-all": "solvers.layered.baselines.symmetric:solve_symmetric_all",
        "random": "solvers.layered.baselines.ablations:solve_random",
        "ablation-one-tp": "solvers.layered.baselines.ablations:solve_one_tp",
        "ablation-equal-batch": "solvers.layered.baselines.ablations:solve_equal_batch",
    },
    "sequence": {
        # HexiSeq's heuristic, then the configuration bound's rounds from its plan on clusters
        # whose device sets can be listed: composed above both (composed.py)
        "heuristic": "solvers.sequence.composed:solve_heuristic",
        "brute": "solvers.sequence.brute:solve",
        "cpsat": "solvers.sequence.exact.cpsat:solve",
        "milp": "solvers.sequence.exact.milp:solve",
        # any size: the heuristic's plan improved and proven by the configuration bound (docs/sequence_bounds.md)
        "bound": "solvers.sequence.bound.solver:solve",
        "seq-uniform": "solvers.sequence.baselines:solve_uniform",
        "seq-uniform-all": "solvers.sequence.baselines:solve_uniform_all",
        "seq-roundrobin": "solvers.sequence.baselines:solve_roundrobin",
    },
}
SOLVERS = SOLVERS_BY_KIND[DEFAULT_KIND]  # the layered plan's solvers: the default kind's


def solvers_listed() -> str:
    """Every registered solver by plan kind, for help texts: "layered: heuristic, …; sequence: …"."""
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in SOLVERS_BY_KIND.items())
# the solvers that prove what they return: under a budget they solve every maximal affordable
# machine set (or carry the budget themselves), and the cost objective over the exact frontier
EXACT_SOLVERS = ("cpsat", "milp", "brute")


def solvers_of(kind: str = DEFAULT_KIND) -> dict[str, str]:
    """The solvers that return plans of `kind`."""
    if kind not in SOLVERS_BY_KIND:
        known = ", ".join(k for k in PLAN_KINDS if k in SOLVERS_BY_KIND)
        raise KeyError(f"unknown plan kind {kind!r}; kinds with solvers: {known}")
    return SOLVERS_BY_KIND[kind]


def available(kind: str = DEFAULT_KIND) -> list[str]:
    return list(solvers_of(kind))


def get(name: str, kind: str = DEFAULT_KIND) -> SolverFn:
    """The solver, made to honour the problem's objective and budget (solvers/objective.py)."""
    entries = solvers_of(kind)
    if name not in entries:
        raise KeyError(f"unknown solver {name!r} for {kind} plans; available: {', '.join(entries)}")
    module, func = entries[name].split(":")
    return _unless_impossible(name, kind, honouring(getattr(importlib.import_module(module), func),
                                                    exact=name in EXACT_SOLVERS))


def _unless_impossible(name: str, kind: str, solver: SolverFn) -> SolverFn:
    """`solver`, answering infeasible at once (with the rule's reason) where no plan of `kind` can
    exist for the problem (`PlanKind.impossible`): every solver of the kind says the same thing,
    and `solve --kind auto` goes on with the other kinds instead of failing on a plan that breaks
    the rule (seq_len 2000 with 64-token blocks had made the sequence heuristic build one)."""
    def solve(problem: Problem, options: SolverOptions) -> SolveResult:
        why = PLAN_KINDS[kind].impossible(problem)
        if why is not None:
            return SolveResult(solver=name, status=SolveStatus.infeasible, wall_s=0.0, message=why)
        return solver(problem, options)
    return solve


def solve(problem: Problem, solver: str = "heuristic", options: SolverOptions | None = None, *,
          kind: str = DEFAULT_KIND) -> SolveResult:
    """Run one registered solver; its plan is of `kind` and judged by `planner.evaluate`."""
    return get(solver, kind)(problem, options or SolverOptions())
