"""The heuristic with one of its ideas taken away (docs/solvers.md §5; HexiScale §5.3, slide 12).

- `random`: phase 1 splits the devices into pools at random (balanced by compute plus
  memory share, as the METIS pools are) instead of by multilevel graph partitioning;
  phase 2, the batch split and the polish are the heuristic's own — the paper's scheduler
  ablation ("vs random graph partition").
- `ablation-one-tp`: every stage of every pipeline gets the same TP size (the symmetric-TP
  constraint of Megatron inside the heuristic); each allowed size is tried and the best plan
  is kept, so the ablation removes only the freedom to mix sizes.
- `ablation-equal-batch`: every pipeline gets the same batch instead of one proportional
  to its speed.

All three run `solvers.layered.heuristic.solve_with` with a `HeuristicOptions` setting, so the only
difference from `heuristic` is the knob named.
"""

from __future__ import annotations

import time

from planner.layered.pricing import iteration_time
from planner.solver_info import SolverInfo, SolveStatus
from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions


def _heuristic(problem: Problem, options: SolverOptions, **knobs) -> SolveResult:
    # imported here: the registry imports this module lazily, and the heuristic may be absent
    from solvers.layered.heuristic import HeuristicOptions, solve_with

    return solve_with(problem, options, HeuristicOptions(**knobs))


def _renamed(result: SolveResult, *, name: str, wall: float, restriction: str,
             message: str = "") -> SolveResult:
    """The heuristic's result, labelled as this baseline's."""
    plan = result.plan
    if plan is not None:
        info = SolverInfo(name=name, status=result.status, objective_s=result.objective_s, wall_s=wall)
        plan = plan.model_copy(update={"solver": info})
    return result.model_copy(update={
        "solver": name, "plan": plan, "wall_s": wall, "bound_s": None,
        "restrictions": (*result.restrictions, restriction),
        "message": message or result.message,
    })


def _ablation(problem: Problem, options: SolverOptions, *, name: str, restriction: str, **knobs) -> SolveResult:
    """The heuristic with one knob set, timed and labelled as the baseline `name`."""
    start = time.perf_counter()
    result = _heuristic(problem, options, **knobs)
    return _renamed(result, name=name, wall=time.perf_counter() - start, restriction=restriction)


def solve_random(problem: Problem, options: SolverOptions) -> SolveResult:
    """Random balanced pools, then the heuristic's phase 2."""
    return _ablation(problem, options, name="random",
                     restriction="phase 1 replaced by a random balanced partition", partitioner="random")


def solve_equal_batch(problem: Problem, options: SolverOptions) -> SolveResult:
    """The heuristic with B split equally over the pipelines."""
    return _ablation(problem, options, name="ablation-equal-batch", restriction="equal batch per pipeline",
                     equal_batch=True)


def solve_one_tp(problem: Problem, options: SolverOptions) -> SolveResult:
    """The heuristic restricted to one TP size, best over the sizes allowed."""
    start = time.perf_counter()
    sizes = problem.model.tp_sizes(max(m.count for m in problem.cluster.machines))
    per_size = options.model_copy(update={"time_limit_s": options.time_limit_s / len(sizes)})
    best: tuple[float, int, SolveResult | None] = (float("inf"), 0, None)
    tried = []
    for tp in sizes:
        result = _heuristic(problem, per_size, fixed_tp=tp)
        t = iteration_time(problem, result.plan) if result.plan is not None else float("inf")
        tried.append(f"t={tp}: " + (f"{t:.4g} s" if result.plan is not None else result.status.value))
        if t < best[0]:
            best = (t, tp, result)
    wall = time.perf_counter() - start
    if best[2] is None:
        return SolveResult(solver="ablation-one-tp", status=SolveStatus.infeasible, wall_s=wall,
                           restrictions=("one TP size for every stage",),
                           message="no TP size gives a plan that fits: " + "; ".join(tried))
    return _renamed(best[2], name="ablation-one-tp", wall=wall,
                    restriction=f"one TP size for every stage (t={best[1]})",
                    message="best single TP size of " + "; ".join(tried))
