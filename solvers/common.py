"""What every solver shares: its options and its result type (docs/solvers.md §5).

A solver is a function `solve(problem, options) -> SolveResult`; `solvers.registry` maps
names to them. Whatever the path, the plan it returns is judged by `planner.evaluate`.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from planner.base import MAX_SEED, Frozen
from planner.kinds import AnyPlan
from planner.layered.plan import Plan
from planner.solver_info import SolveStatus


# The longest time limit, as `--time-limit` allows it (hexiscale/cli/app.py): the solvers turn the
# limit into deadlines and work counts, which an inf or 1e30 would make unbounded.
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0


class SolverOptions(Frozen):
    model_config = ConfigDict(frozen=True, extra="forbid")

    time_limit_s: float = Field(default=60.0, gt=0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False,
                                description="wall-clock budget, seconds (at most a week)")
    threads: int = Field(default=2, ge=1, description="worker threads where the solver uses them")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="random seed; equal seeds give equal plans")
    hint: Plan | None = Field(default=None, description="a plan to warm-start from")
    max_pipelines: int | None = Field(default=None, ge=1, description="limit on D (None: solver default)")
    max_stages: int | None = Field(default=None, ge=1, description="limit on stages per pipeline")
    progress: bool = Field(default=False, description="show progress on the terminal")
    verbose: bool = Field(default=False, description="print the backend's own log")


class ModelSize(Frozen):
    variables: int = Field(ge=0)
    constraints: int = Field(ge=0)


class SolveResult(Frozen):
    solver: str = Field(description="registry name of the solver")
    status: SolveStatus
    plan: AnyPlan | None = Field(default=None, description="best plan found, of either kind (None if none)")
    objective_s: float | None = Field(default=None, ge=0, description="the solver's T for the plan")
    bound_s: float | None = Field(default=None, ge=0, description="proven lower bound on the optimal T")
    wall_s: float = Field(ge=0, description="solve wall time")
    model_size: ModelSize | None = Field(default=None, description="exact models only")
    restrictions: tuple[str, ...] = Field(
        default=(), description="limits that may cut the optimum (e.g. at most 4 pipelines)")
    message: str = Field(default="", description="explanation, e.g. why a problem is infeasible")
    kind_reason: str = Field(default="", description="why this plan kind, when `solvers.choose.solve` chose it "
                                                     "(kind auto); '' when the kind was given")
    kinds_tried: dict[str, float | None] = Field(
        default_factory=dict, description="kind auto: every plan kind solved and its objective (T; cost per Mtok under objective cost; None: no plan found)")
    rent_per_hour: float | None = Field(
        default=None, ge=0, description="the plan's rent per hour (docs/prices.md §13); None without prices or plan")
    cost_per_mtok: float | None = Field(
        default=None, ge=0, description="the plan's cost per million tokens; None without prices or plan")
    cost_bound_per_mtok: float | None = Field(
        default=None, ge=0, description="objective cost: proven lower bound on any plan's cost per million "
                                        "tokens (solvers/frontier.py); None without a proof")

    @property
    def gap(self) -> float | None:
        """(objective − bound) / objective, when both are known."""
        if self.objective_s is None or self.bound_s is None or self.objective_s == 0:
            return None
        return max(0.0, (self.objective_s - self.bound_s) / self.objective_s)
