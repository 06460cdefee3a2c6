"""The solver-side descriptor of every plan kind (`SolverKind`), by the planner's kind name."""

from __future__ import annotations

from solvers import layered, sequence
from solvers.solver_kind import SolverKind

SOLVER_KINDS: dict[str, SolverKind] = {k.name: k for k in (layered.SOLVER_KIND, sequence.SOLVER_KIND)}


def solver_kind(name: str) -> SolverKind:
    if name not in SOLVER_KINDS:
        raise KeyError(f"unknown plan kind {name!r}; kinds with solvers: {', '.join(SOLVER_KINDS)}")
    return SOLVER_KINDS[name]
