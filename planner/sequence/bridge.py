"""What a sequence plan sends over the cross-vendor bridge per iteration, and the seconds of
its T in bridge-bound terms (docs/vendors.md §8 on §7.2; the routing's volumes in `planner.bridge`).
The bytes are those the runtime sends (`runtime.comm.BridgeMeter` counts them per step):
§7.2's volumes, bar three deviations of the runtime, noted where they are counted. HP groups
never span vendors (§7.1 rule 2), so the all-to-alls never cross; what can:

- the CP ring: member i of group g receives from each member j of group g − 1 the kv heads
  o_ij they share (Σ_j o_ij = kv_i), over the bridge when i and j are nvidia and amd. A K/V
  pass brings the s − T_g tokens outside its group, b·(s − T_g)·2·o_ij·d·β bytes, ρ − 1 passes
  a layer (forward, [recomputed forward,] backward). *Deviation 1*: the gradient pass carries
  more than §7.2's (s − T_g): each block's K/V gradient follows its block one hop behind and
  a last hop takes it home (as in ring-flash-attention), so member i receives the gradients
  of all s tokens' K/V, b·s·2·o_ij·d·β (§7.2 prices every pass at s − T_g; reported, the cost
  model's time is not changed here).
- ZeRO-3 over a replica whose devices span V vendors: every unit (embedding, each layer, the
  final norm with the head) is cut into N_r equal blocks of ⌈P_u/N_r⌉ (the last padded,
  `runtime.sequence.shards`), so each all-gather and reduce-scatter moves N_r·⌈P_u/N_r⌉
  elements where §7.2 rounds to P_u, each (V − 1)·x over the bridge; per micro-batch each
  unit's gradients are reduce-scattered once (γ) and its weights all-gathered (β): a layer
  for the forward and once more for the backward. *Deviation 2*: with recompute, the
  recomputed forward's gather also serves the backward, 2 gathers where Z_layer prices
  c − 1 = 3. *Deviation 3*: the embedding's backward needs no weight, 1 gather where Z_ends
  prices c − 1 (the head, not recomputed, takes 2 for any c). Both are cheaper than §7.2.
- the cross-replica sync: every replica cuts each unit into its N_r blocks; each segment
  between all replicas' block boundaries is all-reduced by its owners, one per replica,
  V·(V − 1)·(segment)·γ when they span V vendors.
"""

from __future__ import annotations

import numpy as np

from planner.bridge import (BridgeTraffic, allreduce_bridge_bytes, crosses, gather_bridge_bytes, vendor_codes,
                            vendor_spread)
from planner.problem import Problem
from planner.sequence import cost
from planner.sequence.plan import SeqPlan
from planner.sequence.pricing import require_valid_structure, time_parts
from planner.sequence.table import MemberTable


def _has(problem: Problem, table: MemberTable, starts: np.ndarray, code: int) -> np.ndarray:
    """Per run of members (groups or replicas, by `starts`): whether it holds vendor `code`."""
    codes = vendor_codes(problem.cluster)[problem.cluster.machine_of_device[table.device]]
    return np.logical_or.reduceat(codes == code, starts[:-1])


def crossing_groups(problem: Problem, table: MemberTable) -> np.ndarray:
    """(G,) whether group g and the previous group of its ring are on the bridge's two sides."""
    nv, amd = _has(problem, table, table.group_start, 0), _has(problem, table, table.group_start, 1)
    prev = table.prev_group
    return (nv & amd[prev]) | (amd & nv[prev])


def replica_spread(problem: Problem, table: MemberTable) -> np.ndarray:
    """(D,) V of each replica's devices (0 when it does not span nvidia and amd)."""
    machines = problem.cluster.machine_of_device[table.device]
    return np.array([int(vendor_spread(problem.cluster, machines[lo:hi]))
                     for lo, hi in zip(table.member_start[:-1], table.member_start[1:])])


def kv_spans(problem: Problem, table: MemberTable) -> tuple[np.ndarray, np.ndarray]:
    """(M,) first and stop kv head each member holds inside attention (members take the
    group's heads in member order, as `runtime.sequence.layout` lays them out)."""
    model = problem.model
    end = np.cumsum(table.heads)
    before = (end - table.heads)[table.group_start[:-1]][table.group]  # heads of earlier groups
    lo = end - table.heads - before
    return lo * model.num_kv_heads // model.heads, (lo + table.heads) * model.num_kv_heads // model.heads


def ring_bytes(problem: Problem, table: MemberTable) -> float:
    """Σ over pairs (i in g, j in g − 1) that cross of o_ij·((ρ − 1)·(s − T_g) + s) token rows of
    b·2·d·β bytes, L layers and m_r micro-batches each (module doc, deviation 1)."""
    model, training = problem.model, problem.training
    lo, hi = kv_spans(problem, table)
    shared = np.maximum(np.minimum(hi[:, None], hi[None, :]) - np.maximum(lo[:, None], lo[None, :]), 0)
    g = table.group
    sender_of = (table.prev_group[g][:, None] == g[None, :]) & (table.ring_size[table.replica] > 1)[:, None]
    machine = problem.cluster.machine_of_device[table.device]
    over_bridge = crosses(problem.cluster, machine[:, None], machine[None, :])
    rows = (cost.ring_rounds(training) - 1) * (training.seq_len - table.group_tokens[g]) + training.seq_len
    per_layer = (shared * sender_of * over_bridge).sum(axis=1) * rows * training.micro_batch * 2 \
        * model.head_dim * training.act_bytes
    micro = (table.batch // training.micro_batch)[table.replica]
    return float((per_layer * model.layers * micro).sum())


def unit_sizes(model) -> np.ndarray:
    """P_u of the runtime's ZeRO-3 units: the embedding, each layer, the final norm with the head."""
    return np.array([model.params_embedding] + [model.params_per_layer] * model.layers + [model.params_head])


def unit_gathers(model) -> np.ndarray:
    """All-gathers per micro-batch of each unit: the embedding once, a layer and the head
    twice (forward; backward, or the recomputed forward that serves it) — module doc,
    deviations 2 and 3 (§7.2: c − 1 each)."""
    gathers = np.full(model.layers + 2, 2)
    gathers[0] = 1
    return gathers


def zero_bytes(problem: Problem, table: MemberTable) -> float:
    model, training = problem.model, problem.training
    per_element = unit_gathers(model) * training.act_bytes + training.grad_bytes
    padded = table.replica_size[:, None] * -(-unit_sizes(model)[None, :] // table.replica_size[:, None])
    per_micro = (padded * per_element[None, :]).sum(axis=1)
    micro = table.batch // training.micro_batch
    return float((gather_bridge_bytes(replica_spread(problem, table), per_micro) * micro).sum())


def dp_bytes(problem: Problem, table: MemberTable) -> float:
    """Each unit's segments between every replica's block boundaries (module doc)."""
    if table.num_replicas == 1:
        return 0.0
    sizes, total = table.replica_size, 0.0
    machines = problem.cluster.machine_of_device
    for unit, count in zip(*np.unique(unit_sizes(problem.model), return_counts=True)):
        blocks = -(-unit // sizes)
        cuts = np.unique(np.concatenate([np.minimum(np.arange(n) * c, unit) for n, c in zip(sizes, blocks)]
                                        + [[unit]]))
        starts = cuts[:-1]
        owners = np.stack([table.device[table.member_start[r] + starts // blocks[r]]
                           for r in range(table.num_replicas)], axis=1)
        spread = vendor_spread(problem.cluster, machines[owners])
        total += count * float(allreduce_bridge_bytes(spread, np.diff(cuts) * problem.training.grad_bytes).sum())
    return total


def _bridge_seconds(problem: Problem, table: MemberTable, parts) -> float:
    """Bridge-bound seconds of T: in the slowest replica what its ring adds beyond attention
    (ρ·T_ring − max Catt, when the member that sets T_ring sits after a crossing) and its ZeRO terms
    (when it spans both vendors); T_dp when two replicas hold the two vendors."""
    training, layers = problem.training, problem.model.layers
    r = int(np.argmax(parts.replica_time))
    lo, hi = table.member_start[r], table.member_start[r + 1]
    m = int(parts.micro_batches[r])
    seconds = 0.0
    slowest = lo + int(np.argmax(parts.ring[lo:hi]))
    ring_term = cost.ring_rounds(training) * parts.ring_max[r]
    if crossing_groups(problem, table)[table.group[slowest]] and ring_term > parts.attention_max[r]:
        seconds += m * layers * (ring_term - parts.attention_max[r])
    if replica_spread(problem, table)[r]:
        seconds += m * (layers * parts.zero_layer[r] + parts.zero_ends[r])
    nv, amd = _has(problem, table, table.member_start, 0), _has(problem, table, table.member_start, 1)
    if table.num_replicas > 1 and (nv[:, None] & amd[None, :] & ~np.eye(len(nv), dtype=bool)).any():
        seconds += parts.dp
    return float(seconds)


def sequence_bridge_traffic(problem: Problem, plan: SeqPlan) -> BridgeTraffic:
    """Bytes per iteration over the bridge and the bridge-bound seconds of T (module doc)."""
    table = MemberTable.of(plan)
    require_valid_structure(problem, table)
    parts = time_parts(problem, table)
    by_kind = {"ring": ring_bytes(problem, table), "zero": zero_bytes(problem, table), "dp": dp_bytes(problem, table)}
    return BridgeTraffic(bytes_per_step=sum(by_kind.values()), bytes_by_kind=by_kind,
                         bridge_s=_bridge_seconds(problem, table, parts), iteration_s=parts.iteration)
