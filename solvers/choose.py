"""Which plan kind a problem is solved in, and `solve(problem, solver, kind="auto")` (the API's
`hexiscale.solve`; `hexiscale solve` and `compare` choose by the same rule).

An explicit kind always wins. `auto`: the one kind that has the solver when only one has it
(cpsat → layered, seq-uniform → sequence); else by sequence length: each kind says from which
seq_len on it is chosen (`SolverKind.auto_from_seq_len`: sequence plans from
`solvers.sequence.LONG_CONTEXT_TOKENS` on, where activations and s² attention dominate,
docs/sequence-plans.md §7; layered plans below).
"""

from __future__ import annotations

from planner.problem import Problem
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


def solve(problem: Problem, solver: str = "heuristic", options: SolverOptions | None = None, *,
          kind: str = AUTO_KIND) -> SolveResult:
    """Run one registered solver in `kind` (`auto`: chosen by `choose_kind`); the result says
    why that kind in `kind_reason` ("" when `kind` was given)."""
    chosen, why = choose_kind(problem, kind, solver)
    result = solve_in_kind(problem, solver, options, kind=chosen)
    return result.model_copy(update={"kind_reason": why})
