"""The MILP model (PuLP; HiGHS via highspy, CBC as fallback): docs/formulation.md §2.2.

Layer-indexed: for each pipeline p and layer ℓ, binaries z[p,ℓ,c] say which stage type
holds ℓ and β[p,ℓ] whether a new stage starts at ℓ. Every product is linearized exactly
(big-M with bounds from the tables, a binary expansion of m_p − 1). Times are continuous,
in units of the trivial lower bound (so values are O(1)); the labels [M1]…[M16] are the
constraint families of docs/formulation.md.

`build_model(sub)` returns the PuLP problem and its variables, grouped by family in frozen
dataclasses (as OR-Tools' minimal_jobshop_sat.py groups a task's variables): the families
[M1]–[M12] are written in `milp_model`, the cuts and a fixed structure [M13]–[M16] in
`milp_cuts`; this module builds, solves and reads the solution back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pulp

from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions
from solvers.layered.exact.driver import solve_exact, solver_time
from solvers.layered.exact.subproblem import SubProblem, SubResult
from solvers.layered.exact.rent import milp_rent
from solvers.layered.exact.milp_cuts import CutVars, MilpCutBuilder
from solvers.layered.exact.milp_model import BatchVars, LayoutVars, MemoryVars, SyncVars, TimeVars
from solvers.layered.exact.spec import read_specs
from solvers.layered.exact.warm_start import WarmStartFn
from solvers.layered.tables import PipelineSpec
from solvers.milp_backend import quiet_stdout, read_status, highs_threads

GAP = 1e-9  # relative MIP gap: "optimal" means optimal to float tolerance


@dataclass(frozen=True)
class MilpVars:
    layout: LayoutVars
    batches: BatchVars
    memory: MemoryVars
    times: TimeVars
    sync: SyncVars
    T: pulp.LpVariable  # the objective [M12]
    cuts: CutVars
    stage_of: dict  # (p, ℓ) → [u[p, ℓ, k]] one-hot: ℓ is in stage k, when an order is fixed [M16]
    rented: dict = field(default_factory=dict)  # M → rented_M, under a budget [M18]


def build_model(sub: SubProblem) -> tuple[pulp.LpProblem, MilpVars]:
    """The MILP of docs/formulation.md §2.2 for one D, and its variables."""
    b = MilpCutBuilder(sub)
    layout = b.layout()
    batches = b.batches()
    memory = b.memory(layout, batches.micro)
    times = b.pipe_times(layout, batches.bits)
    sync = b.dp_sync(layout)
    total = b.cont("T")
    for p in b.P:  # [M12] T ≥ T_pipe(p) + T_dp
        b.add(total >= times.bubble[p] + times.steady[p] + sync.t_dp)
    busy = b.capacity_cuts(total, layout, batches.micro)
    b.valid_cuts(total, times, sync)
    allocation, micro_is = b.floor_cuts(total, layout, batches.micro)
    stage_of = b.structure(layout, batches.micro)
    rented = milp_rent(b, layout.z)
    b.lp += total
    cuts = CutVars(busy=busy, allocation=allocation, micro_is=micro_is)
    return b.lp, MilpVars(layout=layout, batches=batches, memory=memory, times=times, sync=sync,
                          T=total, cuts=cuts, stage_of=stage_of, rented=rented)


# -- reading the solution back --------------------------------------------------------
def specs(v: MilpVars, types: list, layers: int) -> list[PipelineSpec]:
    return read_specs(lambda var: var.value() or 0.0, types=types, layers=layers, z=v.layout.z,
                      beta=v.layout.beta, micro=v.batches.micro)


def _solver(sub: SubProblem, time_limit: float):
    opts = sub.options
    if pulp.HiGHS().available():
        return pulp.HiGHS(msg=opts.verbose, timeLimit=time_limit, threads=opts.threads,
                          gapRel=GAP, gapAbs=1e-9, random_seed=opts.seed,
                          mip_feasibility_tolerance=1e-9, primal_feasibility_tolerance=1e-9)
    return pulp.PULP_CBC_CMD(msg=opts.verbose, timeLimit=time_limit, threads=opts.threads,
                             gapRel=GAP, options=[f"randomSeed {opts.seed}"])


def solve_fixed_d(sub: SubProblem) -> SubResult:
    start = time.perf_counter()
    lp, v = build_model(sub)
    unit = sub.tables.trivial_bound  # the MILP's time unit
    size = dict(variables=len(lp.variables()), constraints=lp.numConstraints(),
                build_s=time.perf_counter() - start)
    solver = _solver(sub, solver_time(sub, start))
    highs_threads(sub.options.threads)
    with quiet_stdout(not sub.options.verbose):
        lp.solve(solver)
    status, has_solution, unit_bound = read_status(lp, solver)
    bound = None if unit_bound is None else max(0.0, unit_bound) * unit
    if not has_solution:
        return SubResult(status=status, bound=bound, **size)
    return SubResult(status=status, specs=specs(v, sub.tables.types, sub.tables.layers),
                     objective=v.T.value() * unit, bound=bound, **size)


def solve(problem: Problem, options: SolverOptions | None = None, *,
          warm_start_fn: WarmStartFn | None = None) -> SolveResult:
    """Exact MILP solve: the optimum of docs/cost-model.md §3 over the plan space of §2, with a bound.
    `warm_start_fn` supplies the first incumbent beyond tiny problems (None: the symmetric
    baseline's; the registry's `milp` passes the heuristic's, solvers/layered/composed.py)."""
    return solve_exact(problem, options or SolverOptions(), "milp", solve_fixed_d, warm_start_fn)
