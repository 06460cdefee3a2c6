"""Every plan kind, and the judges that dispatch on a plan's kind: `evaluate`, `validate`,
`iteration_time` accept a plan of any kind and call that kind's own function; `AnyPlan` is the
field type of a plan of any kind."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field

from planner import cost, layered, sequence
from planner.headline import Headline
from planner.plan_kind import PlanKind
from planner.prices import cost_of, rent_per_hour
from planner.problem import Problem
from planner.violations import Violation

PLAN_KINDS: dict[str, PlanKind] = {k.name: k for k in (layered.KIND, sequence.KIND)}
# A plan of any kind as a pydantic field, told apart by its file format tag
AnyPlan = Annotated[Union[tuple(k.plan_type for k in PLAN_KINDS.values())], Field(discriminator="format")]  # noqa: UP007


def kind_of(plan: Any) -> PlanKind:
    """The kind of a plan object (by its type)."""
    for kind in PLAN_KINDS.values():
        if isinstance(plan, kind.plan_type):
            return kind
    raise TypeError(f"not a plan of any known kind ({', '.join(PLAN_KINDS)}): {type(plan).__name__}")


def kind_of_format(fmt: Any) -> PlanKind | None:
    """The kind whose file format tag is `fmt`, or None."""
    return next((k for k in PLAN_KINDS.values() if k.format == fmt), None)


def evaluate(problem: Problem, plan: Any):
    """Price a plan of any kind: T with all its parts (the kind's own `Estimate`)."""
    return kind_of(plan).evaluate(problem, plan)


def validate(problem: Problem, plan: Any) -> list[Violation]:
    """Every violated rule of a plan of any kind (empty when the plan is valid)."""
    return kind_of(plan).validate(problem, plan)


def iteration_time(problem: Problem, plan: Any) -> float:
    """T of a plan of any kind, checked for soundness first."""
    return kind_of(plan).iteration_time(problem, plan)


def headline(problem: Problem, plan: Any) -> Headline:
    """T, tokens/s, MFU, rent and cost per million tokens of a plan of any kind: `evaluate`'s
    figures without its per-stage parts and simulated schedules (most of its 2 s on a plan of
    10^5 devices, which `compare` priced once per solver)."""
    t = iteration_time(problem, plan)
    rent = rent_per_hour(problem, plan)
    return Headline(iteration_s=t, tokens_per_s=cost.tokens_per_second(problem.training, t),
                    mfu=cost.model_flops_utilization(problem.model, problem.training, t, problem.cluster.total_peak_flops),
                    rent_per_hour=rent, cost_per_mtok=cost_of(problem, rent, t))
