"""What shared solver code (`solvers.choose`, `solvers.replan`, `hexiscale compare`) needs to
know of a plan kind: the solvers compare runs by default, the homogeneous baseline its
speed-up column divides by, from which sequence length `solve(kind="auto")` picks the kind,
and the kind's re-plan after lost devices.

Each kind's solvers (`solvers/<kind>/`) describe themselves with one `SolverKind` in their
package's `__init__`; `solvers.kinds` lists them by the planner's kind name. Which solvers a
kind has is `solvers.registry`'s.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SolverKind:
    name: str  # the planner's kind name (planner.kinds.PLAN_KINDS), and this kind's solvers' folder
    default_solvers: tuple[str, ...]  # what `hexiscale compare` runs when no solver is named
    reference: str  # the homogeneous baseline: compare's speed-up column is T_reference / T
    reference_label: str  # that column's header
    # `module:function` of the re-plan after lost devices (docs/checkpoints.md §10), imported on first
    # use (it solves afresh through the registry): candidates(old problem, plan, survivors'
    # problem, old id → new id, *, solver, options, trained, trained_seq_len, deadline) ->
    # solvers.repair_parts.Candidates
    replan: str
    also_compare: tuple[str, ...] = ()  # other kinds' solvers (KIND:NAME) compare prices beside this kind's
    auto_from_seq_len: int = 0  # solve(kind="auto") picks the kind with the largest such bound ≤ seq_len
    # `module:function` (problem) -> why the kind's exact models cannot take it, or None; "" when
    # they take any problem the callers give them (`frontier`'s default picks cpsat by it)
    exact_too_big: str = ""

    def exact_refusal(self, problem) -> str | None:
        """Why this kind's exact models would refuse `problem` for its size, or None."""
        if not self.exact_too_big:
            return None
        module, function = self.exact_too_big.split(":")
        return getattr(importlib.import_module(module), function)(problem)

    def replanner(self) -> Callable:
        module, function = self.replan.split(":")
        return getattr(importlib.import_module(module), function)
