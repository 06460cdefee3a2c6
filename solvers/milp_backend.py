"""Running a PuLP model, shared by the MILPs of every plan kind: HiGHS (via highspy) prints
its banner past PuLP's `msg`, and its status and dual bound are read from highspy itself
(PuLP's own status loses the bound); CBC is the fallback where HiGHS is missing.
"""

from __future__ import annotations

import contextlib
import os
import sys

import pulp


@contextlib.contextmanager
def quiet_stdout(quiet: bool):
    """HiGHS prints its banner from C++ straight to file descriptor 1, whatever msg says;
    it would corrupt `hexiscale solve --json`."""
    if not quiet:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


_SCHEDULER_THREADS: list[int] = []  # the size of HiGHS's process-wide scheduler, once one is made


def highs_threads(threads: int) -> None:
    """Call before a HiGHS run that asks for `threads`. HiGHS sizes one thread scheduler per
    process at its first run; a later run asking another size fails ("Option 'threads' is set
    to 2 but the scheduler has already been initialized to use 1 threads"), which reads as
    'no plan found within the time limit': after the configuration bound's 1-thread solves,
    every 2-thread MILP of the process failed so. The scheduler is remade when the size changes."""
    if _SCHEDULER_THREADS == [threads]:
        return
    try:
        import highspy
    except ImportError:  # CBC's runs have no such scheduler
        return
    highspy.Highs.resetGlobalScheduler(True)
    _SCHEDULER_THREADS[:] = [threads]


def quiet_highs(threads: int = 1):
    """A bare highspy model for the bounds' own LPs and MILPs: made without its banner, output
    off, `threads` asked for and the process's scheduler sized to match (`highs_threads`)."""
    import highspy

    with quiet_stdout(True):
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", threads)
    highs_threads(threads)
    return h


def highs_solve_error(lp: pulp.LpProblem) -> bool:
    """Whether HiGHS ended in kSolveError: its postsolve returned a solution that misses a row by
    more than the feasibility tolerance asked (4e-9 against 1e-9 on rows of 1e8 coefficients)."""
    highs = getattr(lp, "solverModel", None)
    if highs is None:
        return False
    import highspy

    return highs.getModelStatus() == highspy.HighsModelStatus.kSolveError


def read_status(lp: pulp.LpProblem, solver) -> tuple[str, bool, float | None]:
    """(status, has a solution, lower bound in model units) from HiGHS or CBC."""
    highs = getattr(lp, "solverModel", None)
    if isinstance(solver, pulp.HiGHS) and highs is not None:
        import highspy

        info, ms = highs.getInfo(), highs.getModelStatus()
        if ms == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", False, None
        has = info.primal_solution_status == 2  # kSolutionStatusFeasible
        dual = info.mip_dual_bound
        bound = dual if abs(dual) < 1e30 else None
        optimal = ms == highspy.HighsModelStatus.kOptimal
        return ("optimal" if optimal else "feasible" if has else "unknown"), has, bound
    if lp.status == pulp.LpStatusInfeasible:
        return "infeasible", False, None
    has = lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    optimal = lp.sol_status == pulp.LpSolutionOptimal
    bound = pulp.value(lp.objective) if optimal else None
    return ("optimal" if optimal else "feasible" if has else "unknown"), has, bound
