"""The Python API's entry points that take a problem (`hexiscale.validate`, `evaluate`, `solve`,
`replan`, `run_plan`): each checks its problem, plan and options afresh, then calls the planner's,
solvers' or runtime's own function.

pydantic's `model_copy(update=...)`, the natural way to vary a frozen problem, does not validate:
a problem changed that way could carry seq_len 0, a ZeRO stage 5 or a cluster of no machines
into the solvers, which then failed deep inside (ZeroDivisionError, IndexError) or answered
nonsense (T = 0.00016 s). No flag tells a changed object from a loaded one (model_copy copies
every attribute), so every call validates its inputs again: 0.12 s on a problem of 10^5 devices
(measured; reading its file takes 0.9 s). The call then uses the validated copy, whose cached
properties (devices, link tables) are computed from its own fields, not copied from the
original. A problem or plan may also be given as a file's path or a bundled name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from planner import kinds
from planner.io import build, load_plan, load_problem
from planner.problem import Problem
from planner.violations import Violation
from planner.workload import ModelSpec
from runtime.launch import launcher
from solvers import choose
from solvers import replan as replanning
from solvers.common import SolveResult, SolverOptions

__all__ = ["checked_plan", "checked_problem", "evaluate", "replan", "run_plan", "solve", "validate"]


def _revalidated(value: Any, argument: str) -> Any:
    """`value` validated again as its own type; an InputError in the loader's one line
    ("problem: training.seq_len: Input should be greater than or equal to 1 (got 0)") otherwise. Names
    are not held to a file's MAX_NAME: a replanned problem's derived name may be longer."""
    data = value.model_dump(warnings=False)  # a wrong type (a str global batch) is validation's to report
    return build(type(value), data, argument, context=None)


def checked_problem(problem: Any) -> Problem:
    """`problem` validated afresh, or read from a file path or bundled name as `load_problem` does."""
    if isinstance(problem, (str, os.PathLike)):
        return load_problem(problem)
    if not isinstance(problem, Problem):
        raise TypeError(f"problem: expected a hexiscale.Problem, or a problem file's path or bundled name, "
                        f"got {type(problem).__name__}")
    return _revalidated(problem, "problem")


def checked_plan(plan: Any) -> Any:
    """`plan` (of any kind) validated afresh, or read from a file path or bundled name as `load_plan` does."""
    if isinstance(plan, (str, os.PathLike)):
        return load_plan(plan)
    kinds.kind_of(plan)  # a TypeError naming the plan kinds for anything else (None included)
    return _revalidated(plan, "plan")


def _checked_options(options: SolverOptions | None) -> SolverOptions | None:
    if options is None:
        return None
    if not isinstance(options, SolverOptions):
        raise TypeError(f"options: expected a hexiscale.SolverOptions or None, got {type(options).__name__}")
    return _revalidated(options, "options")


def validate(problem: Problem | str | Path, plan: Any) -> list[Violation]:
    """Every violated rule of a plan of any kind (empty when the plan is valid)."""
    return kinds.validate(checked_problem(problem), checked_plan(plan))


def evaluate(problem: Problem | str | Path, plan: Any):
    """Price a plan of any kind: T with all its parts (the kind's own `Estimate`)."""
    return kinds.evaluate(checked_problem(problem), checked_plan(plan))


def solve(problem: Problem | str | Path, solver: str = "heuristic", options: SolverOptions | None = None, *,
          kind: str = choose.AUTO_KIND) -> SolveResult:
    return choose.solve(checked_problem(problem), solver, _checked_options(options), kind=kind)


def replan(problem: Problem | str | Path, plan: Any, lost=(), *, lost_machines=(), solver: str = "heuristic",
           options: SolverOptions | None = None, trained: ModelSpec | None = None,
           trained_seq_len: int | None = None) -> replanning.ReplanResult:
    return replanning.replan(checked_problem(problem), checked_plan(plan), lost, lost_machines=lost_machines,
                             solver=solver, options=_checked_options(options), trained=trained,
                             trained_seq_len=trained_seq_len)


def run_plan(problem: Problem | str | Path, plan: Any, model: str = "tiny", steps: int = 3, echo: bool = True,
             resume: str | Path | None = None, **settings) -> launcher.RunResult:
    return launcher.run_plan(checked_problem(problem), checked_plan(plan), model, steps, echo, resume, **settings)


# the docstrings that say what each does, and what it raises, are the wrapped functions' own
solve.__doc__ = choose.solve.__doc__
replan.__doc__ = replanning.replan.__doc__
run_plan.__doc__ = launcher.run_plan.__doc__
