"""The one place a CP-SAT solver is made (`cp_solver`), for both plan kinds' exact models.

CP-SAT catches SIGINT itself by default (`catch_sigint_signal`): a Ctrl-C during a solve then
aborted the whole process (`std::bad_function_call`, SIGABRT) or was taken as "stop this solve"
while the command went on to exit 0, and after any solve SIGINT was left at the operating
system's default, so a later Ctrl-C killed the process with nothing printed and nothing
cleaned up. With it off, a Ctrl-C is Python's KeyboardInterrupt like everywhere else: one line
and exit 130 (`hexiscale.interrupt`)."""

from __future__ import annotations

from ortools.sat.python import cp_model


def cp_solver(*, time_limit_s: float, threads: int, seed: int = 0, verbose: bool = False) -> cp_model.CpSolver:
    """A CpSolver with the project's settings and SIGINT left to Python."""
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = seed
    solver.parameters.log_search_progress = verbose
    return solver
