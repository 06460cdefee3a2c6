"""The runtime of sequence plans (docs/sequence-plans.md §7): replicas (data-parallel, ZeRO-3 inside),
each a ring of context-parallel groups, each group head-parallel members with uneven heads
and tokens.

Modules from the bottom up: `layout` (plan → ranks, heads, tokens, true positions; pure) →
`job` (the job of a plan for a problem, the tiny model and the scaled plan; no torch) →
`checkpoint` (ZeRO-3 blocks ↔ the plan-independent checkpoint's chunks) →
`shards` (ZeRO-3 block and cross-replica segment arithmetic) → `groups` (creates this rank's
process groups through the communicator) → `attention` (Ulysses + ring attention) → `zero`
(ZeRO-3 gather/reduce-scatter) → `member` (one member's model) → `sync` (cross-replica
gradient sync) → `worker` (trains one rank; imports torch). `KIND` registers it in
`runtime.kinds`.
"""

from runtime.runtime_kind import RuntimeKind
from runtime.sequence.job import make_sequence_job, sequence_devices, with_model

# a profile for sequence plans writes the all-to-all's fit: the Ulysses exchanges' (on gloo,
# ZeRO-3's all-gathers and reduce-scatters cost like it, not like the all-reduce)
KIND = RuntimeKind(name="sequence", make_job=make_sequence_job, devices=sequence_devices,
                   worker="runtime.sequence.worker", with_model=with_model, profiled_op="all_to_all")

__all__ = ["KIND", "make_sequence_job", "sequence_devices"]
