"""hexiscale runtime: train a Llama-style model under any valid plan (DESIGN.md §6).

    from runtime import rank_layout, run_plan
    layout = rank_layout(plan)            # pure: ranks, TP groups, leader pairs, chunk groups
    result = run_plan(problem, plan, model="tiny", steps=3)   # one local process per device

Modules: layout (plan → ranks, pure), groups (the one place that creates process groups),
model (parameter catalogue, deterministic init, reference model), tp (Megatron-style
tensor-parallel autograd functions), stage (one TP-sharded pipeline stage), schedule
(1F1B / GPipe, leader-to-leader exchange), grad_sync (asymmetric finest-shard DP sync),
data (synthetic stream, byte-level corpus), worker (per-rank entry), launch (local
processes, torchrun commands), reference (one-process training for equivalence checks).
Importing this package does not import torch; starting a run does.
"""

from runtime.launch import RunError, RunResult, make_job, run_plan
from runtime.layout import LayoutError, RankLayout, rank_layout

__all__ = ["LayoutError", "RankLayout", "RunError", "RunResult", "make_job", "rank_layout", "run_plan"]
