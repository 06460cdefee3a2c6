"""What the runtime needs to know of a plan kind: how to make its job and which processes it
needs (no torch), the worker module that trains one rank of it (imports torch), and which
measured link operation a profile for its plans writes.

Each kind's runtime lives in its own folder (`runtime/layered/`, ...) and describes itself
with one `RuntimeKind`; `runtime.kinds` lists them by the planner's kind name
(`planner.kinds`), so that a new kind arrives as a new folder and one entry there, never as
a branch inside another kind's code.

The worker module (`worker`) must define:
- `plan_rank(job, machine) -> int`: this process's rank (RANK, or machine + LOCAL_RANK);
- `check_job(job, world_size)`: raise `runtime.errors.ConfigError` if the job cannot run;
- `describe_rank(job, rank) -> str`: "rank R (...)", the prefix of its error lines;
- `rank_places(job) -> tuple[RankPlace, ...]`: device, machine and vendor of every rank;
- `train(job, comm)`: train this rank for the configured steps, then report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class RuntimeKind:
    name: str  # the planner's kind name (planner.kinds.PLAN_KINDS), and this runtime's folder
    make_job: Callable[..., Any]  # (problem, plan, model, **settings) -> Job; checks the plan
    devices: Callable[[Any], list[int]]  # the plan's devices in rank order, one process each
    worker: str  # module name of the per-rank entry points (see above)
    with_model: Callable[[Any, Any], Any]  # (job, model) -> the job training that model (a
    # checkpoint's); ValueError if the plan cannot split it
    # the link operation whose fit `hexiscale profile --for KIND` writes as the cluster's links:
    # the collective the kind's plans lean on (runtime.profiling.fit)
    profiled_op: str
    # the precisions (runtime.precision) its workers run, the first the default on CPU
    # (docs/models-and-data.md §12); a job asking for another is refused before any process
    precisions: tuple[str, ...] = ("fp32",)

    def worker_module(self) -> ModuleType:
        return import_module(self.worker)

    def world_size(self, plan: Any) -> int:
        return len(self.devices(plan))
