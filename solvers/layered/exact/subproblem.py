"""One D's model as the driver hands it to a backend (CP-SAT or MILP) and gets it back: the
sub-problem (its tables, D, cutoff, hint, bounds, structure and the deadline its build must
keep) and the sub-result (status, pipelines, objective, bound, size)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

from solvers.common import SolverOptions
from solvers.layered.exact.bounds import Candidate, PipelineFloors
from solvers.layered.tables import PipelineSpec, Tables

SubStatus = Literal["optimal", "feasible", "infeasible", "unknown"]


@dataclass
class SubResult:
    """What one backend model (fixed D) found. `infeasible` means: no plan with T ≤ cutoff."""

    status: SubStatus
    specs: list[PipelineSpec] | None = None
    objective: float | None = None  # the model's T for specs, seconds
    bound: float | None = None  # lower bound on the optimum for this D, seconds
    variables: int = 0
    constraints: int = 0
    error_bound: float = 0.0  # |model T − true T| ≤ this, for any plan (integer time units)
    build_s: float = 0.0  # time spent building the model


@dataclass
class SubProblem:
    """Everything a backend needs to build and solve the model for one D."""

    tables: Tables
    pipelines: int
    options: SolverOptions
    time_limit: float
    cutoff: float | None  # only plans with T ≤ cutoff are of interest
    hint: list[PipelineSpec] | None
    max_stages: int
    log: Callable[[str], None] = field(default=lambda s: None)
    lower_bound: float = 0.0  # [B2]: every plan with D pipelines has T ≥ this
    floors: PipelineFloors | None = None  # [B1]/[B3]: T ≥ floors.table[m_p, a_p] for each p
    structure: list[Candidate] | None = None  # [B4]: pipeline p has exactly this shape and m_p
    build_deadline: float = math.inf  # perf_counter time: the build stops here (BuildStopped)

    @property
    def pipeline_range(self) -> TimedRange:
        """The pipelines, for the builders' loops: stops the build at its deadline."""
        return TimedRange(self.pipelines, self.build_deadline)


Backend = Callable[[SubProblem], SubResult]


class BuildStopped(Exception):
    """A model's build reached its D's share of the time: the D is left open."""


class TimedRange:
    """range(n) over a model's pipelines whose iteration raises BuildStopped past `deadline`.
    Every family of variables and constraints loops over the pipelines, so a build stops
    within one pipeline's part of it (on the 96-GPU offers problem one model of D = 27 took
    12 s to build with a share of the time under 0.1 s, and `solve -s cpsat -t 5` 16 s)."""

    def __init__(self, n: int, deadline: float):
        self.n, self.deadline = n, deadline

    def __iter__(self):
        for i in range(self.n):
            if time.perf_counter() > self.deadline:
                raise BuildStopped
            yield i

    def __len__(self) -> int:
        return self.n
