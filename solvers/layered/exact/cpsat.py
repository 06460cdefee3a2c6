"""The CP-SAT model (OR-Tools): docs/formulation.md §2.1.

Layer-indexed like the MILP, but written with CP-SAT's own constraints: enforcement
literals instead of big-M, element constraints for table look-ups (pipeline traffic,
memory), exact integer products for the 1F1B term and min/max equalities, so that every
intermediate variable equals its value in docs/cost-model.md. Times are integers in a unit chosen so
that rounding every coefficient down keeps the model's T within a reported bound below the
true T (docs/formulation.md §2.1, "time units"). Labels [C1]…[C15] cite the constraint families.

`build_model(sub, scale)` returns the model and its variables, grouped by family in frozen
dataclasses (as OR-Tools' minimal_jobshop_sat.py groups a task's variables): the families are
written in `cpsat_model`, the time unit in `cpsat_units`; this module builds, hints, solves
and reads the solution back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions
from solvers.cp_sat import cp_solver
from solvers.layered.exact.cpsat_model import CpSatBuilder, LayoutVars, MemoryVars, SyncVars, TimeVars
from solvers.layered.exact.cpsat_units import TimeScale, time_scale
from solvers.layered.exact.driver import solve_exact, solver_time
from solvers.layered.exact.subproblem import SubProblem, SubResult
from solvers.layered.exact.rent import cpsat_rent
from solvers.layered.exact.spec import read_specs
from solvers.layered.exact.warm_start import WarmStartFn
from solvers.layered.tables import PipelineSpec

__all__ = ["CpSatVars", "add_hint", "build_model", "solve", "solve_fixed_d", "specs", "time_scale"]


@dataclass(frozen=True)
class CpSatVars:
    layout: LayoutVars
    micro: dict  # p → m_p [C6]
    memory: MemoryVars
    times: TimeVars
    sync: SyncVars
    pipe_max: cp_model.IntVar  # max_p T_pipe(p) [C12]
    T: cp_model.IntVar  # the objective [C12]
    floors: dict  # p → pipe_floor[m_p, a_p] [C14]
    stage_of: dict  # (p, ℓ) → the stage holding ℓ, when a stage order is fixed [C15]
    rented: dict = field(default_factory=dict)  # M → rented_M, under a budget [C17]


def build_model(sub: SubProblem, scale: TimeScale) -> tuple[cp_model.CpModel, CpSatVars]:
    """The CP-SAT model of docs/formulation.md §2.1 for one D, and its variables."""
    b = CpSatBuilder(sub, scale)
    layout = b.layout()
    micro = b.batches()
    memory = b.memory(layout, micro)
    times = b.pipe_times(layout, micro)
    sync = b.dp_sync(layout)
    pipe_max, total = b.objective(times, sync, micro)
    floors = b.floor_cuts(total, layout, micro)
    stage_of = b.structure(layout, micro)
    rented = cpsat_rent(b, layout.z)
    b.model.minimize(total)
    return b.model, CpSatVars(layout=layout, micro=micro, memory=memory, times=times, sync=sync,
                              pipe_max=pipe_max, T=total, floors=floors, stage_of=stage_of, rented=rented)


# -- hint and solution --------------------------------------------------------------------
def add_hint(model: cp_model.CpModel, v: CpSatVars, specs: list[PipelineSpec], types: list) -> None:
    """A warm start's pipelines (largest m_p first [R2]) as CP-SAT's solution hint."""
    for p, spec in enumerate(sorted(specs, key=lambda s: -s.micro_batches)):
        model.add_hint(v.micro[p], spec.micro_batches)
        layer = 0
        for stage_type, n in spec.stages:
            for j in range(n):
                for ci, c in enumerate(types):
                    model.add_hint(v.layout.z[p, layer, ci], int(c == stage_type))
                if layer:
                    model.add_hint(v.layout.beta[p, layer], int(j == 0))
                layer += 1


def specs(solver: cp_model.CpSolver, v: CpSatVars, types: list, layers: int) -> list[PipelineSpec]:
    return read_specs(solver.value, types=types, layers=layers, z=v.layout.z, beta=v.layout.beta, micro=v.micro)


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, unit: float, d: int, log):
        super().__init__()
        self.unit, self.d, self.log = unit, d, log

    def on_solution_callback(self) -> None:
        self.log(f"D={self.d}: solution T ≤ {self.objective_value * self.unit:.6g} s "
                 f"(bound {self.best_objective_bound * self.unit:.6g} s)")


STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
          cp_model.INFEASIBLE: "infeasible", cp_model.UNKNOWN: "unknown"}


def _solver(sub: SubProblem, build_start: float) -> cp_model.CpSolver:
    return cp_solver(time_limit_s=solver_time(sub, build_start), threads=sub.options.threads, seed=sub.options.seed,
                     verbose=sub.options.verbose)


def solve_fixed_d(sub: SubProblem) -> SubResult:
    start = time.perf_counter()
    scale = time_scale(sub)
    model, v = build_model(sub, scale)
    if sub.hint:
        add_hint(model, v, sub.hint, sub.tables.types)
    size = dict(variables=len(model.proto.variables), constraints=len(model.proto.constraints),
                build_s=time.perf_counter() - start)
    solver = _solver(sub, start)
    code = solver.solve(model, _Progress(scale.unit, sub.pipelines, sub.log))
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT model invalid: {model.validate()}")
    status, error = STATUS[code], scale.error_units * scale.unit
    bound = solver.best_objective_bound * scale.unit if status in ("optimal", "feasible", "unknown") else None
    if status not in ("optimal", "feasible"):
        return SubResult(status=status, bound=bound if status == "unknown" else None,
                         error_bound=error, **size)
    return SubResult(status=status, specs=specs(solver, v, sub.tables.types, sub.tables.layers),
                     objective=solver.objective_value * scale.unit, bound=bound, error_bound=error, **size)


def solve(problem: Problem, options: SolverOptions | None = None, *,
          warm_start_fn: WarmStartFn | None = None) -> SolveResult:
    """Exact CP-SAT solve: the optimum of docs/cost-model.md §3 over the plan space of §2, with a bound.
    `warm_start_fn` supplies the first incumbent beyond tiny problems (None: the symmetric
    baseline's; the registry's `cpsat` passes the heuristic's, solvers/layered/composed.py)."""
    return solve_exact(problem, options or SolverOptions(), "cpsat", solve_fixed_d, warm_start_fn)
