"""The evaluator of sequence plans: T with every part of docs/sequence-plans.md §7.2–§7.3 as a typed
`SeqEstimate`, and the term that sets it. The numbers come from `planner.sequence.pricing`."""

from __future__ import annotations

import numpy as np

from planner.base import GIB, format_seconds
from planner.prices import cost_of, rent_of_devices
from planner.problem import Problem
from planner import cost as shared_cost
from planner.sequence import cost
from planner.sequence.estimate import Bottleneck, SeqEstimate
from planner.sequence.plan import SeqPlan
from planner.sequence.pricing import MemoryParts, TimeParts, memory_parts, require_valid_structure, time_parts
from planner.sequence.table import MemberTable
from planner.base import plural

__all__ = ["evaluate", "find_bottleneck"]


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def evaluate(problem: Problem, plan: SeqPlan | MemberTable) -> SeqEstimate:
    """Price a sequence plan: T with all its parts, tokens/s, MFU, memory and the bottleneck.

    Raises InvalidPlanError when rules 1–4 of §7.1 fail; an out-of-memory plan is priced and
    shows negative headroom (use `validate` to reject it)."""
    table = plan if isinstance(plan, MemberTable) else MemberTable.of(plan)
    require_valid_structure(problem, table)
    t, mem = time_parts(problem, table), memory_parts(problem, table)
    groups = _group_rows(problem, table, t, _member_rows(problem, table, t, mem))
    replicas = [
        {"index": r, "batch": int(table.batch[r]), "micro_batches": int(t.micro_batches[r]),
         "devices": int(table.replica_size[r]),
         "linear_s": t.linear_max[r], "a2a_s": cost.a2a_rounds(problem.training) * t.a2a_max[r],
         "attention_s": t.attention_max[r], "ring_s": cost.ring_rounds(problem.training) * t.ring_max[r],
         "layer_s": t.layer[r], "zero_bw_gbps": _finite(t.replica_bw[r]), "zero_layer_s": t.zero_layer[r],
         "zero_ends_s": t.zero_ends[r], "head_s": t.head_max[r], "micro_batch_s": t.micro_batch[r],
         "time_s": t.replica_time[r], "groups": groups[table.ring_start[r]:table.ring_start[r + 1]]}
        for r in range(table.num_replicas)]
    training, rent = problem.training, rent_of_devices(problem, table.device)
    return SeqEstimate.model_validate({
        "iteration_s": t.iteration, "replica_s": float(t.replica_time.max()), "dp_s": t.dp,
        "dp_bw_gbps": _finite(t.dp_bw),
        "tokens_per_s": shared_cost.tokens_per_second(training, t.iteration),
        "mfu": shared_cost.model_flops_utilization(problem.model, training, t.iteration, problem.cluster.total_peak_flops),
        "min_headroom_gib": float((mem.capacity - mem.total).min() / GIB),
        "rent_per_hour": rent, "cost_per_mtok": cost_of(problem, rent, t.iteration),
        "replicas": replicas, "bottleneck": find_bottleneck(problem, table, t),
    })


_MEMBER_FIELDS = ("replica", "group", "index", "device", "machine", "heads", "tokens", "kv_heads",
                  "linear_s", "attention_s", "ring_s", "head_s", "states_gib", "gathered_gib",
                  "activations_gib", "ring_buffers_gib", "logits_gib", "memory_gib", "capacity_gib",
                  "headroom_gib")


def _member_rows(problem: Problem, table: MemberTable, t: TimeParts, mem: MemoryParts) -> list[dict]:
    """The fields of each MemberEstimate; arrays go to Python numbers in bulk (tolist)."""
    names = [m.name for m in problem.cluster.machines]
    m = table.num_members
    columns = (
        table.replica.tolist(), table.position[table.group].tolist(),
        (np.arange(m) - table.group_start[table.group]).tolist(), table.device.tolist(),
        [names[x] for x in t.machine.tolist()], table.heads.tolist(), table.tokens.tolist(),
        cost.kv_heads_of(problem.model, table.heads).tolist(), t.linear.tolist(), t.attention.tolist(),
        t.ring.tolist(), t.head.tolist(), (mem.states / GIB).tolist(), [mem.gathered / GIB] * m,
        (mem.activations / GIB).tolist(), (mem.ring_buffers / GIB).tolist(), (mem.logits / GIB).tolist(),
        (mem.total / GIB).tolist(), (mem.capacity / GIB).tolist(), ((mem.capacity - mem.total) / GIB).tolist())
    return [dict(zip(_MEMBER_FIELDS, row)) for row in zip(*columns)]


def _group_rows(problem: Problem, table: MemberTable, t: TimeParts, members: list[dict]) -> list[dict]:
    tokens, first = table.group_tokens.tolist(), table.first_token.tolist()
    return [
        {"replica": int(table.group_replica[g]), "index": int(table.position[g]), "tokens": tokens[g],
         "first_token": first[g], "pairs": t.pairs[g], "hp_bw_gbps": _finite(t.hp_bw[g]),
         "hp_lat_s": t.hp_lat[g], "a2a_qkv_s": t.a2a_qkv[g], "a2a_out_s": t.a2a_out[g],
         "a2a_s": t.a2a_qkv[g] + t.a2a_out[g], "ring_bw_gbps": t.ring_bw[g], "ring_lat_s": t.ring_lat[g],
         "ring_s": t.group_ring[g], "members": members[table.group_start[g]:table.group_start[g + 1]]}
        for g in range(table.num_groups)]


_LABELS = {"linear_compute": "linear compute", "attention_compute": "attention compute",
           "head_parallel": "the HP all-to-all", "context_parallel": "the CP ring",
           "zero": "ZeRO-3 gathers and reduce-scatters", "lm_head": "the LM head"}


def _replica_terms(problem: Problem, t: TimeParts, r: int) -> dict[str, float]:
    """Each term's share of replica r's time T_rep = m_r·T_mb."""
    training, layers, m = problem.training, problem.model.layers, int(t.micro_batches[r])
    ring = cost.ring_rounds(training) * t.ring_max[r]
    attention = ("context_parallel", ring) if ring > t.attention_max[r] else ("attention_compute", t.attention_max[r])
    return {"linear_compute": m * layers * t.linear_max[r],
            "head_parallel": m * layers * cost.a2a_rounds(training) * t.a2a_max[r],
            attention[0]: m * layers * attention[1],
            "zero": m * (layers * t.zero_layer[r] + t.zero_ends[r]),
            "lm_head": m * t.head_max[r]}


def _limiting_member(table: MemberTable, values: np.ndarray, r: int) -> int:
    lo, hi = table.member_start[r], table.member_start[r + 1]
    return int(lo + np.argmax(values[lo:hi]))


def find_bottleneck(problem: Problem, table: MemberTable, t: TimeParts) -> Bottleneck:
    """The DP sync if it outweighs the slowest replica, else that replica's largest term, with
    the member (or group) that sets it."""
    r = int(np.argmax(t.replica_time))
    if t.dp > t.replica_time[r]:
        return Bottleneck(kind="data_parallel", seconds=t.dp, description=(
            f"gradient sync across {plural(table.num_replicas, 'replica')} takes {format_seconds(t.dp)}, more than "
            f"the slowest replica ({format_seconds(t.replica_time[r])})"))
    terms = _replica_terms(problem, t, r)
    kind = max(terms, key=terms.__getitem__)
    by_member = {"linear_compute": t.linear, "attention_compute": t.attention, "context_parallel": t.ring,
                 "lm_head": t.head}
    out = {"kind": kind, "replica": r, "seconds": float(terms[kind])}
    where = ""
    if kind in by_member:
        i = _limiting_member(table, by_member[kind], r)
        g = int(table.group[i])
        out |= {"group": int(table.position[g]), "member": int(i - table.group_start[g])}
        where = f" (group {out['group']} member {out['member']}, device {int(table.device[i])})"
    elif kind == "head_parallel":
        lo, hi = table.ring_start[r], table.ring_start[r + 1]
        out["group"] = int(np.argmax((t.a2a_qkv + t.a2a_out)[lo:hi]))
        where = f" (group {out['group']})"
    out["description"] = (f"replica {r} (T_rep {format_seconds(t.replica_time[r])}) is limited by "
                          f"{_LABELS[kind]}{where}: {format_seconds(terms[kind])} of the iteration")
    return Bottleneck(**out)
