"""The training bytes each precision scheme holds and moves (docs/models-and-data.md §12; no
torch): what the run says it runs, and where the problem it was planned for priced other
bytes (μ, μ_w, μ_o, γ, β of §1) — the plan's memory and times then assumed another scheme.

- fp32: weights, gradients and Adam's moments in fp32; the weights are the master copy:
  μ = 4 + 4 + 8, μ_w = 4, μ_o = 8, γ = β = 4.
- bf16: bf16 weights, gradients and activations; fp32 master weights and moments:
  μ = 2 + 2 + 12, μ_w = 2, μ_o = 12, γ = β = 2 (the defaults of §1).
"""

from __future__ import annotations

from typing import NamedTuple

from planner.workload import TrainingSpec
from runtime.config import RunConfig


class Scheme(NamedTuple):
    weight_bytes: int  # μ_w
    grad_bytes: int  # kept gradients, and γ on the wire
    optimizer_bytes: int  # μ_o: master weights (bf16 only) and both moments
    act_bytes: int  # β

    @property
    def param_state_bytes(self) -> int:
        """μ = μ_w + gradients + μ_o."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


SCHEMES = {"fp32": Scheme(4, 4, 8, 4), "bf16": Scheme(2, 2, 12, 2)}
DESCRIPTIONS = {"fp32": "fp32 weights (the master copy), gradients, moments and activations",
                "bf16": "bf16 weights, gradients and activations; fp32 master weights and moments; no loss scaling"}


def scheme_line(config: RunConfig, pipelines: int) -> str:
    """One line: the scheme the run runs and its bytes per parameter (ZeRO-1's share of μ_o)."""
    scheme = SCHEMES[config.precision]
    state = f"μ = {scheme.weight_bytes} + {scheme.grad_bytes} + {scheme.optimizer_bytes}"
    if config.zero_stage == 1 and pipelines >= 2:
        state += f" with ZeRO-1: {scheme.optimizer_bytes}/{pipelines} of the optimizer state per owner"
    split = "; sequence parallelism in TP stages" if config.sequence_parallel else ""
    return (f"precision {config.precision}: {DESCRIPTIONS[config.precision]} ({state}; "
            f"γ = β = {scheme.grad_bytes}){split}")


def training_byte_notes(training: TrainingSpec, precision: str) -> list[str]:
    """One note naming every byte count the problem priced differently from the run's scheme
    (none when they agree)."""
    scheme = SCHEMES[precision]
    priced = {"μ": (training.param_state_bytes, scheme.param_state_bytes),
              "μ_w": (training.weight_bytes, scheme.weight_bytes),
              "μ_o": (training.optimizer_bytes, scheme.optimizer_bytes),
              "γ": (training.grad_bytes, scheme.grad_bytes), "β": (training.act_bytes, scheme.act_bytes)}
    differ = [(name, problem, held) for name, (problem, held) in priced.items() if problem != held]
    if not differ:
        return []
    problem = ", ".join(f"{name} = {value:g}" for name, value, _ in differ)
    held = ", ".join(f"{name} = {value}" for name, _, value in differ)
    return [f"note: the problem's training prices {problem} bytes; this {precision} run holds {held}: "
            f"the plan's memory and times assumed other bytes (--precision, or the problem's training)"]


def held_training(training: TrainingSpec, precision: str) -> TrainingSpec:
    """`training` with the bytes the precision scheme holds and moves (μ, μ_w, μ_o, γ, β): what
    a run of that scheme is priced at, whatever the problem assumed."""
    scheme = SCHEMES[precision]
    return training.model_copy(update={"param_state_bytes": scheme.param_state_bytes,
                                       "weight_bytes": scheme.weight_bytes, "grad_bytes": scheme.grad_bytes,
                                       "optimizer_bytes": scheme.optimizer_bytes, "act_bytes": scheme.act_bytes})
