"""Rules 1–4 of docs/sequence-plans.md §7.1 (everything but memory), checked with numpy over a plan's
members; only offenders are visited in Python. Each violation names where it is (replica,
group, member) and its numbers."""

from __future__ import annotations

import numpy as np

from planner.hardware import Vendor
from planner.problem import Problem
from planner.sequence.table import MemberTable
from planner.violations import Violation


def location(table: MemberTable, group: int, member: int | None = None) -> str:
    """"replica r group g[ member i (device d)]": positions inside the plan, 0-based."""
    r = int(table.group_replica[group])
    text = f"replica {r} group {int(table.position[group])}"
    if member is not None:
        text += f" member {member - int(table.group_start[group])} (device {int(table.device[member])})"
    return text


def _device_violations(problem: Problem, table: MemberTable) -> list[Violation]:
    """Rule 1 (each device a member at most once) and device ids that do not exist."""
    n = problem.cluster.num_devices
    out = []
    missing = (table.device >= n) | (table.device < 0)  # a solver's arrays may hold anything
    for g in np.unique(table.group[missing]).tolist():
        lo, hi = table.group_start[g], table.group_start[g + 1]
        gone = [int(d) for d in table.device[lo:hi] if not 0 <= d < n]
        out.append(Violation(rule="device", message=f"{location(table, g)}: devices {gone} do not exist "
                                                    f"(cluster has {n}: 0..{n - 1})"))
    ids, counts = np.unique(table.device, return_counts=True)
    for d, count in zip(ids[counts > 1].tolist(), counts[counts > 1].tolist()):
        out.append(Violation(rule="device", message=f"device {d} is a member {count} times"))
    return out


def _head_violations(problem: Problem, table: MemberTable) -> list[Violation]:
    """Rule 2, heads: Σ heads = a per group; each member holds whole kv heads (a/k multiple)."""
    a, k = problem.model.heads, problem.model.num_kv_heads
    per_kv = a // k
    out = []
    for g in np.flatnonzero(table.group_heads != a).tolist():
        out.append(Violation(rule="heads", message=f"{location(table, g)}: heads sum to "
                                                   f"{int(table.group_heads[g])}, the model has a = {a}"))
    for i in np.flatnonzero((table.heads < 1) | (table.heads % per_kv != 0)).tolist():
        out.append(Violation(rule="heads", message=(
            f"{location(table, int(table.group[i]), i)}: heads {int(table.heads[i])} is not a positive multiple of "
            f"a/k = {a}/{k} = {per_kv} (a member holds whole kv heads)")))
    return out


def no_token_layout(problem: Problem) -> str | None:
    """Why no ring can split the sequence (rule 3: the groups' T_g are multiples of 2q summing to
    s), or None."""
    s, q = problem.training.seq_len, problem.training.token_block
    if s % (2 * q) == 0:
        return None
    return (f"seq_len {s} is not a multiple of 2·token_block = {2 * q}: no ring of groups can split it "
            f"(every group holds a multiple of 2q tokens)")


def _token_violations(problem: Problem, table: MemberTable) -> list[Violation]:
    """Rule 2, tokens (t_i a positive multiple of q) and rule 3 (Σ T_g = s, T_g a multiple of 2q)."""
    q, s = problem.training.token_block, problem.training.seq_len
    out = []
    for i in np.flatnonzero((table.tokens < q) | (table.tokens % q != 0)).tolist():
        out.append(Violation(rule="tokens", message=(
            f"{location(table, int(table.group[i]), i)}: tokens {int(table.tokens[i])} is not a positive "
            f"multiple of the token block q = {q}")))
    shard = table.group_tokens
    for g in np.flatnonzero(shard % (2 * q) != 0).tolist():
        out.append(Violation(rule="shards", message=(
            f"{location(table, g)}: shard T_g = {int(shard[g])} tokens is not a multiple of 2q = {2 * q} "
            f"(half at each end of the sequence)")))
    for r in np.flatnonzero(table.replica_tokens != s).tolist():
        out.append(Violation(rule="shards", message=(
            f"replica {r}: group shards sum to {int(table.replica_tokens[r])} tokens, "
            f"the sequence has s = {s}")))
    return out


def _vendor_violations(problem: Problem, table: MemberTable) -> list[Violation]:
    """Rule 2 (§8): no group holds both nvidia and amd members (devices must exist)."""
    cluster = problem.cluster
    vendor = np.array([cluster.gpu_of(m).vendor.value for m in range(len(cluster.machines))])
    of_member = vendor[cluster.machine_of_device[table.device]]
    nvidia = np.logical_or.reduceat(of_member == Vendor.nvidia.value, table.group_start[:-1])
    amd = np.logical_or.reduceat(of_member == Vendor.amd.value, table.group_start[:-1])
    out = []
    for g in np.flatnonzero(nvidia & amd).tolist():
        lo, hi = table.group_start[g], table.group_start[g + 1]
        by = {v: [int(d) for d, w in zip(table.device[lo:hi], of_member[lo:hi]) if w == v] for v in ("nvidia", "amd")}
        out.append(Violation(rule="vendor", message=(
            f"{location(table, g)} mixes nvidia devices {by['nvidia']} and amd devices {by['amd']} "
            f"(no collective library spans two vendors)")))
    return out


def _batch_violations(problem: Problem, table: MemberTable) -> list[Violation]:
    """Rule 4: B_r a positive multiple of b, Σ B_r = B."""
    b, big_b = problem.training.micro_batch, problem.training.global_batch
    out = [Violation(rule="batch", message=f"replica {r}: batch {int(table.batch[r])} is not a positive "
                                           f"multiple of micro-batch {b}")
           for r in np.flatnonzero((table.batch < b) | (table.batch % b != 0)).tolist()]
    total = int(table.batch.sum())
    if total != big_b:
        out.append(Violation(rule="batch", message=f"replica batches sum to {total}, the global batch is {big_b}"))
    return out


def devices_exist(problem: Problem, table: MemberTable) -> bool:
    return bool(((table.device >= 0) & (table.device < problem.cluster.num_devices)).all())


def structural_violations(problem: Problem, table: MemberTable) -> list[Violation]:
    """Rules 1–4: everything but memory."""
    out = (_device_violations(problem, table) + _head_violations(problem, table)
           + _token_violations(problem, table))
    if devices_exist(problem, table):
        out += _vendor_violations(problem, table)
    return out + _batch_violations(problem, table)
