"""The heuristic's own knobs (docs/solvers.md §5), one frozen options object.

The random-partition baseline and the two ablations of docs/solvers.md §5 are settings of this
object (`partitioner="random"`, `fixed_tp=...`, `equal_batch=True`), so that they run
exactly the same phase 2, batch split and polish as the heuristic itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from planner.base import Frozen


# The structure moves' default work: proportional to the time the user grants, so that a longer
# limit searches further while the plan still does not depend on the machine's speed. 400 in
# all stopped the 64-GPU generated clusters 3-6 % above where the same moves reach with 1,600
# (benchmarks/report/bounds.md); one evaluation there takes about 3 ms on one core.
MOVE_EVALUATIONS_PER_S = 160
MIN_MOVE_EVALUATIONS = 400
# and at most a week's worth: an API caller's limit of inf (or 1e308) is "no limit", not a count
# int() cannot hold; the moves stop where no neighbour helps long before either
MAX_MOVE_EVALUATIONS = MOVE_EVALUATIONS_PER_S * 7 * 24 * 3600


class HeuristicOptions(Frozen):
    partitioner: Literal["metis", "random"] = Field(
        default="metis", description="phase 1: METIS multilevel k-way, or a random balanced split")
    protect: Literal["auto", "pipeline", "data", "machines", "tiered", "uneven"] = Field(
        default="auto",
        description="which traffic the pools keep on fast links: 'pipeline' = METIS min-cut "
                    "(DP crosses the slowest links), 'data' = striped pools (each machine dealt "
                    "across pools, so a layer's DP holders share machines), 'machines' = striped "
                    "but a group of like machines that D divides dealt whole, 'tiered' = pools of "
                    "unequal speed filled fastest device first (each holding 1, 1.5, 2 or 3 model "
                    "replicas' states, the last the rest), 'uneven' = machines of a group smaller "
                    "than D dealt whole, the others cut 5/8 or 3/4 to the strongest pool; 'auto' "
                    "tries all of them up to 512 "
                    "devices and 'pipeline' alone above")
    fixed_tp: int | None = Field(
        default=None, ge=1, description="ablation: one TP size for every stage (a power of two)")
    max_tp: int | None = Field(
        default=None, ge=1, description="a hard limit on every stage's TP size (a power of two), kept by the "
                                        "build, the hint and the structure moves alike (a replan keeps the TP "
                                        "sizes that split a resumed model); the secondary splits are capped at it")
    equal_batch: bool = Field(
        default=False, description="ablation: equal batch per pipeline instead of by speed")
    pipelines: tuple[int, ...] | None = Field(
        default=None, description="D candidates to try (None: chosen from memory and batch bounds)")
    max_d_candidates: int = Field(
        default=14, ge=1, description="coarse D grid size before refining around the best D")
    tp_caps: tuple[int | None, ...] = Field(
        default=(None, 1, 2),
        description="secondary-split candidates: the largest TP size a stage may take "
                    "(None: the cost model chooses freely per machine)")
    beam_width: int = Field(default=4, ge=1, description="top-τ width of the stage-order search")
    polish_candidates: int = Field(
        default=3, ge=1, description="how many of the best structures get the full polish")
    polish_rounds: int = Field(default=400, ge=0, description="limit on accepted polish moves")
    exhaustive_moves: int = Field(
        default=600, ge=0,
        description="if a plan has at most this many single moves, the polish checks them all "
                    "with the full evaluator (else only moves that touch the bottleneck)")
    move_devices: int = Field(
        default=64, ge=0,
        description="clusters of at most this many devices get the structure moves (moves.py: "
                    "drop/add/move stages, split/merge pipelines, change TP) after the polish; 0: off")
    move_rounds: int = Field(default=50, ge=0, description="limit on accepted structure moves")
    move_evaluations: int | None = Field(
        default=None, ge=0, description="the structure moves assemble and price at most this many "
                                        "structures (a work limit: the plan does not depend on the "
                                        "machine's speed), shared by the polished starts; None: "
                                        f"{MOVE_EVALUATIONS_PER_S} per second of the time limit, "
                                        f"at least {MIN_MOVE_EVALUATIONS}")
    exact_devices: int = Field(
        default=8, ge=0,
        description="clusters of at most this many devices spend the time left on the exact CP-SAT "
                    "model warm-started from the heuristic's plan (read by the registry's "
                    "heuristic, solvers/layered/composed.py; this package's own search ignores it); 0: off")

    def evaluations_for(self, time_limit_s: float) -> int:
        """The structure moves' work limit under a time limit (the field, else the default)."""
        if self.move_evaluations is not None:
            return self.move_evaluations
        return max(MIN_MOVE_EVALUATIONS, int(min(MOVE_EVALUATIONS_PER_S * time_limit_s, MAX_MOVE_EVALUATIONS)))

    @property
    def is_plain(self) -> bool:
        """The heuristic itself, not a baseline or ablation setting (those keep the paper's
        phases only: no structure moves, no exact refinement)."""
        return self.partitioner == "metis" and self.fixed_tp is None and not self.equal_batch

    @field_validator("fixed_tp", "max_tp")
    @classmethod
    def _power_of_two(cls, t: int | None, info) -> int | None:
        if t is not None and t & (t - 1):
            raise ValueError(f"{info.field_name} must be a power of two, got {t}")
        return t
