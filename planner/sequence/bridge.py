"""What a sequence plan sends over the cross-vendor bridge per iteration, and the seconds of
its T in bridge-bound terms (DESIGN.md §8 on §7.2; the routing's volumes in `planner.bridge`).
HP groups never span vendors (§7.1 rule 2), so the all-to-alls never cross; what can:

- the CP ring: member i of group g receives the K and V of its kv heads for the s − T_g
  tokens outside its group from group g − 1, b·(s − T_g)·2·kv_i·d·β bytes a pass, ρ passes a
  layer (forward, recomputed forward, backward) — over the bridge when g − 1 and g are on
  its two sides;
- ZeRO-3 over a replica whose devices span V vendors: per layer and micro-batch c − 1
  all-gathers of P_layer·β and one reduce-scatter of P_layer·γ, and per micro-batch the same
  for P_emb + P_head, each (V − 1)·x;
- the cross-replica sync: every replica cuts P_total into N_r equal blocks in member order;
  each segment of the finest cut is all-reduced by its owners, one per replica,
  V·(V − 1)·(segment)·γ when they span V vendors.
"""

from __future__ import annotations

import numpy as np

from planner import cost as common_cost
from planner.bridge import BridgeTraffic, allreduce_bridge_bytes, gather_bridge_bytes, vendor_codes, vendor_spread
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


def ring_bytes(problem: Problem, table: MemberTable) -> float:
    model, training = problem.model, problem.training
    g = table.group
    per_pass = (training.micro_batch * (training.seq_len - table.group_tokens[g]) * 2
                * cost.kv_heads_of(model, table.heads) * model.head_dim * training.act_bytes)
    per_pass = np.where(crossing_groups(problem, table)[g], per_pass, 0)
    micro = (table.batch // training.micro_batch)[table.replica]
    return float((per_pass * cost.ring_rounds(training) * model.layers * micro).sum())


def zero_bytes(problem: Problem, table: MemberTable) -> float:
    model, training = problem.model, problem.training
    passes = common_cost.pass_multiplier(training)
    per_params = (passes - 1) * training.act_bytes + training.grad_bytes
    per_micro = per_params * (model.layers * model.params_per_layer + cost.end_params(model))
    micro = table.batch // training.micro_batch
    return float((gather_bridge_bytes(replica_spread(problem, table), per_micro) * micro).sum())


def dp_bytes(problem: Problem, table: MemberTable) -> float:
    if table.num_replicas == 1:
        return 0.0
    sizes = table.replica_size
    cuts = np.unique(np.concatenate([np.arange(n + 1) / n for n in sizes.tolist()]))
    middle = (cuts[1:] + cuts[:-1]) / 2
    owners = np.stack([table.device[table.member_start[r] + np.floor(middle * n).astype(np.int64)]
                       for r, n in enumerate(sizes.tolist())], axis=1)
    spread = vendor_spread(problem.cluster, problem.cluster.machine_of_device[owners])
    segment = np.diff(cuts) * problem.model.total_params * problem.training.grad_bytes
    return float(allreduce_bridge_bytes(spread, segment).sum())


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
