"""Every solver path by name: `solve(problem, solver="...")` and the CLI reach them here.

Entries are "module:function" strings imported on first use, so that asking for the
heuristic never imports OR-Tools or torch.
"""

from __future__ import annotations

import importlib
from typing import Callable

from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions

SolverFn = Callable[[Problem, SolverOptions], SolveResult]

SOLVERS: dict[str, str] = {
    # name -> "module:function"; each path's issue adds its entries.
    "heuristic": "solvers.layered.heuristic:solve",
    "cpsat": "solvers.layered.exact.cpsat:solve",
    "milp": "solvers.layered.exact.milp:solve",
    "brute": "solvers.layered.exact.brute:solve",
    "symmetric": "solvers.layered.baselines.symmetric:solve_symmetric",
    "symmetric-all": "solvers.layered.baselines.symmetric:solve_symmetric_all",
    "random": "solvers.layered.baselines.ablations:solve_random",
    "ablation-one-tp": "solvers.layered.baselines.ablations:solve_one_tp",
    "ablation-equal-batch": "solvers.layered.baselines.ablations:solve_equal_batch",
}


def available() -> list[str]:
    return list(SOLVERS)


def get(name: str) -> SolverFn:
    if name not in SOLVERS:
        raise KeyError(f"unknown solver {name!r}; available: {', '.join(SOLVERS)}")
    module, func = SOLVERS[name].split(":")
    return getattr(importlib.import_module(module), func)


def solve(problem: Problem, solver: str = "heuristic", options: SolverOptions | None = None) -> SolveResult:
    return get(solver)(problem, options or SolverOptions())
