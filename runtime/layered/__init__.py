"""The runtime of layered plans (docs/plan-space.md §2, docs/solvers.md §6): pipelines of tensor-parallel stages.

Modules from the bottom up: `layout` (plan → ranks and groups, pure) → `job` (the job of a
plan for a problem; no torch) → `groups` (creates this rank's process groups through the
communicator) → `stage` (one TP-sharded stage of the model) → `schedule` (runs a schedule's
actions; leader-to-leader exchange) → `grad_sync` (asymmetric finest-shard DP sync) →
`worker` (trains one rank; imports torch). `KIND` registers it in `runtime.kinds`.
"""

from runtime.layered.job import make_layered_job, rank_devices, tiny_model, with_model
from runtime.layered.layout import LayoutError, RankLayout, rank_layout
from runtime.runtime_kind import RuntimeKind

KIND = RuntimeKind(name="layered", make_job=make_layered_job, devices=rank_devices,
                   worker="runtime.layered.worker", with_model=with_model,
                   profiled_op="all_reduce",  # the TP and gradient terms' all-reduce
                   precisions=("fp32", "bf16"))

__all__ = ["KIND", "LayoutError", "RankLayout", "make_layered_job", "rank_devices", "rank_layout", "tiny_model"]
