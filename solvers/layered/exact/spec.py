"""What the CP-SAT and MILP models share outside their constraints: reading a solved model
back into `PipelineSpec` lists, and the schedule's in-flight rule (docs/cost-model.md §3.5 q).

Both models are layer-indexed (docs/formulation.md §2): z[p, ℓ, c] says that stage type c
holds layer ℓ of pipeline p, β[p, ℓ] (ℓ ≥ 1) that a new stage starts at ℓ, and m_p is the
pipeline's micro-batch count. A solution read through `value` (a solver's value of one
variable) gives each pipeline's stages in order with their layer counts.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from planner.workload import TrainingSpec
from solvers.layered.tables import PipelineSpec, StageType

# q of §3.5 per schedule: "stages" is 1F1B's min(S − k, m_p), "all" is GPipe's m_p
IN_FLIGHT_RULES = {"1f1b": "stages", "gpipe": "all"}


def in_flight_rule(training: TrainingSpec) -> str:
    """How the exact models write q for the training's schedule ("stages" or "all")."""
    rule = IN_FLIGHT_RULES.get(training.schedule)
    if rule is None:
        raise ValueError(f"the exact models price memory for the schedules {', '.join(IN_FLIGHT_RULES)}, "
                         f"not {training.schedule!r}")
    return rule


def read_specs(value: Callable[[Any], float], *, types: list[StageType], layers: int,
               z: Mapping, beta: Mapping, micro: Mapping) -> list[PipelineSpec]:
    """The pipelines of a solved layer-indexed model: z[p, ℓ, c], β[p, ℓ] and m_p read
    through `value` (the type of layer ℓ is its largest z, a stage starts where β > ½)."""
    out = []
    for p in range(len(micro)):
        stages: list[list] = []
        for layer in range(layers):
            c = max(range(len(types)), key=lambda c: value(z[p, layer, c]))
            if layer == 0 or value(beta[p, layer]) > 0.5:
                stages.append([types[c], 1])
            else:
                stages[-1][1] += 1
        out.append(PipelineSpec(stages=tuple((c, n) for c, n in stages),
                                micro_batches=int(round(value(micro[p])))))
    return out
