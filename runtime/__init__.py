"""hexiscale runtime: train a Llama-style model under any valid plan (DESIGN.md §6).

    from runtime import rank_layout, run_plan
    layout = rank_layout(plan)            # pure: ranks, TP groups, leader pairs, chunk groups
    result = run_plan(problem, plan, model="tiny", steps=3)   # one local process per device

Shared by every plan kind: config (run settings, the job), comm (the communicator: the one
owner of torch.distributed — sends, receives, collectives, group creation — and of each
rank's machine and vendor), kinds (the runtime of each plan kind, by the planner's kind
name), model (parameter catalogue, deterministic init, reference model), tp (Megatron-style
tensor-parallel autograd functions over the communicator), data (synthetic stream, byte-level
corpus), worker (per-rank entry), launch (local processes, torchrun commands), host (this host's
cores: whether its ranks share them), reference
(one-process training for equivalence checks), failure (test-only failure injection),
checkpoint / checkpoint_io / resume (plan-independent checkpoints), elastic (re-plan and
restart after a lost rank).
Layered plans: `runtime.layered` (layout, job, groups, stage, schedule, grad_sync, worker).
Importing this package does not import torch; starting a run does.
"""

from runtime.errors import RunError
from runtime.launch import RunResult, make_job, run_plan
from runtime.layered.layout import LayoutError, RankLayout, rank_layout

__all__ = ["LayoutError", "RankLayout", "RunError", "RunResult", "make_job", "rank_layout", "run_plan"]
