"""hexiscale runtime: train a Llama-style model under any valid plan (docs/solvers.md §6).

    from runtime import rank_layout, run_plan
    layout = rank_layout(plan)            # pure: ranks, TP groups, leader pairs, chunk groups
    result = run_plan(problem, plan, model="tiny", steps=3)   # one local process per device

Packages, bottom up (see runtime/README.md): `errors`, `config` (run settings, the job),
`host` (this host's cores), `failure` (test-only failure injection) and `metrics` (step timing,
the run log) · `communication` (the one owner of torch.distributed) · `model` (the Llama
decoder, TP functions, data, the one-process reference) · `checkpoints` (plan-independent
format) · `layered/`, `sequence/` (one folder per plan kind) · `kinds` (the runtime of each
kind, by the planner's kind name) · `launch` (launcher, per-rank worker, resume, elastic) ·
`profiling` (`hexiscale profile`).
Importing this package does not import torch; starting a run does.
"""

from runtime.errors import RunError
from runtime.launch.launcher import RunResult, make_job, run_plan
from runtime.layered.layout import LayoutError, RankLayout, rank_layout

__all__ = ["LayoutError", "RankLayout", "RunError", "RunResult", "make_job", "rank_layout", "run_plan"]
