"""A sequence plan's job (no torch): the plan checked against the problem, the model actually
trained, and the plan scaled to that model and sequence (docs/sequence-plans.md §7.1).

`--model tiny` keeps the plan's structure — replicas, batches, groups, members, each member's
share of the heads and of the tokens — on a small model and a short sequence:
- heads: member i's kv heads kv_i = heads_i·k/a are divided by their common divisor (every
  share stays whole kv heads, the ratios stay exact); the query heads per kv head are the
  problem's, capped at 2; head dim 8, at least 32 hidden units (kv heads doubled if needed);
- tokens: t_i/q (token blocks) divided by the largest common divisor that keeps every group's
  shard even (the mirrored halves of §7.1 exist), so the scaled token block is 1 token and
  the scaled sequence is s' = Σ_g T_g' (at least 16 tokens) — exact shares. When that s' exceeds 256 tokens (shares
  with no large common divisor), the sequence is 256 tokens and the shares are apportioned
  (largest remainders: each shard even, each member ≥ 1 token); so is any other seq_len
  asked for (`--seq-len`) that the exact ratios do not divide.
The job carries the scaled plan; the workers never see the original one.
"""

from __future__ import annotations

from math import gcd

from planner.problem import Problem
from planner.sequence.plan import SeqPlan
from planner.sequence.rules import structural_violations
from planner.sequence.table import MemberTable
from planner.workload import ModelSpec
from runtime.checkpoints.manifest import problem_hash
from runtime.config import BYTE_VOCAB, Job, RunConfig
from runtime.errors import RunError

TINY_HEAD_DIM = 8
TINY_MIN_HIDDEN = 32
TINY_MIN_SEQ_LEN = 16  # below it a tiny run says little (one or two tokens per member)
TINY_MAX_SEQ_LEN = 256  # the exact tiny sequence of a plan with coprime shares can be long


def kv_shares(plan: SeqPlan, model: ModelSpec) -> list[int]:
    """kv heads of every member, in plan order."""
    per_kv = model.heads // model.num_kv_heads
    return [m.heads // per_kv for r in plan.replicas for g in r.ring for m in g.members]


def tiny_sequence_model(model: ModelSpec, plan: SeqPlan) -> ModelSpec:
    """A small model with the same L whose kv heads split as the plan's members split them."""
    divisor = 0
    for kv in kv_shares(plan, model):
        divisor = gcd(divisor, kv)
    kv_heads, ratio = model.num_kv_heads // divisor, min(model.heads // model.num_kv_heads, 2)
    while kv_heads * ratio * TINY_HEAD_DIM < TINY_MIN_HIDDEN:
        kv_heads *= 2
    hidden = kv_heads * ratio * TINY_HEAD_DIM
    ffn = -(-(8 * hidden // 3) // 8) * 8  # ≈ 8h/3 as in Llama
    return ModelSpec(name=f"tiny({model.name})", layers=model.layers, hidden=hidden, heads=kv_heads * ratio,
                     kv_heads=kv_heads, ffn_hidden=ffn, vocab=BYTE_VOCAB, gated=model.gated)


def tiny_seq_len(plan: SeqPlan, *, seq_len: int, token_block: int) -> int:
    """The shortest sequence (but ≥ 16 tokens, or s/q if fewer) that keeps every member's
    token share exactly: s/q token blocks divided by the largest common divisor of the
    members' blocks that leaves every group's shard even."""
    blocks = [[m.tokens // token_block for m in g.members] for r in plan.replicas for g in r.ring]
    common = 0
    for n in (n for group in blocks for n in group):
        common = gcd(common, n)
    shortest = min(TINY_MIN_SEQ_LEN, seq_len // token_block)
    divisor = max(d for d in range(1, common + 1) if common % d == 0 and seq_len // token_block // d >= shortest
                  and all((sum(group) // d) % 2 == 0 for group in blocks))
    return seq_len // token_block // divisor


def run_violations(plan: SeqPlan, model: ModelSpec, seq_len: int) -> list[str]:
    """What keeps a (scaled) plan from running this model and sequence: each group's heads sum
    to a, each member holds whole kv heads, each replica's shards sum to seq_len, each shard
    is even (the mirrored halves of §7.1)."""
    per_kv, out = model.heads // model.num_kv_heads, []
    for r, replica in enumerate(plan.replicas):
        if replica.tokens != seq_len:
            out.append(f"replica {r}: shards sum to {replica.tokens} tokens, seq_len is {seq_len}")
        for g, group in enumerate(replica.ring):
            if group.heads != model.heads:
                out.append(f"replica {r} group {g}: heads sum to {group.heads}, the model has {model.heads}")
            if group.tokens % 2:
                out.append(f"replica {r} group {g}: shard of {group.tokens} tokens is odd (no mirrored halves)")
            out += [f"replica {r} group {g} member {i}: {m.heads} heads are not whole kv heads "
                    f"({per_kv} query heads each)" for i, m in enumerate(group.members) if m.heads % per_kv]
    return out


def apportion(weights: list[int], total: int, minima: list[int]) -> list[int]:
    """Whole numbers ≥ `minima` summing to `total`, as near the shares of `weights` as the
    largest-remainder method gets (Σ minima ≤ total)."""
    exact = [w * total / sum(weights) for w in weights]
    out = [max(int(e), m) for e, m in zip(exact, minima)]
    while sum(out) < total:
        out[max(range(len(out)), key=lambda i: exact[i] - out[i])] += 1
    while sum(out) > total:
        out[max((i for i in range(len(out)) if out[i] > minima[i]), key=lambda i: out[i] - exact[i])] -= 1
    return out


def ring_tokens(ring, *, source_len: int, target_len: int) -> list[list[int]]:
    """Every member's tokens of one replica's ring at `target_len`: the exact ratio when it
    gives whole tokens and even shards; otherwise apportioned (each shard even, each member
    at least one token)."""
    exact = [[m.tokens * target_len / source_len for m in g.members] for g in ring]
    if all(t.is_integer() for group in exact for t in group) and all(sum(group) % 2 == 0 for group in exact):
        return [[int(t) for t in group] for group in exact]
    shortest = sum(2 * -(-len(g.members) // 2) for g in ring)  # each member a token, each shard even
    if target_len < shortest:
        raise RunError(f"seq_len {target_len} is too short for a ring of {len(ring)} group(s) of "
                       f"{'+'.join(str(len(g.members)) for g in ring)} members: it needs at least {shortest} tokens "
                       f"(each member one, each group's shard even)")
    halves = apportion([g.tokens for g in ring], target_len // 2, [-(-len(g.members) // 2) for g in ring])
    return [apportion([m.tokens for m in g.members], 2 * half, [1] * len(g.members))
            for g, half in zip(ring, halves)]


def scale_plan(plan: SeqPlan, *, source: ModelSpec, target: ModelSpec, source_len: int, target_len: int) -> SeqPlan:
    """The plan with every member's heads and tokens scaled from (source model, source_len) to
    (target model, target_len) (`ring_tokens`); a head share that does not scale to whole kv
    heads is a RunError naming it."""
    kv_scale, rings = (target.num_kv_heads, source.num_kv_heads), []
    per_kv_source, per_kv_target = source.heads // source.num_kv_heads, target.heads // target.num_kv_heads
    for r, replica in enumerate(plan.replicas):
        ring = []
        tokens = ring_tokens(replica.ring, source_len=source_len, target_len=target_len)
        for g, group in enumerate(replica.ring):
            members = []
            for i, m in enumerate(group.members):
                kv = m.heads // per_kv_source * kv_scale[0]
                if kv % kv_scale[1]:
                    raise RunError(f"replica {r} group {g} member {i}: its {m.heads} heads do not scale to "
                                   f"whole kv heads of the model {target.name!r} ({target.num_kv_heads} kv heads)")
                members.append((m.device, kv // kv_scale[1] * per_kv_target, tokens[g][i]))
            ring.append(members)
        rings.append(ring)
    return SeqPlan.from_rings(problem=plan.problem, batches=[r.batch for r in plan.replicas], rings=rings)


def make_sequence_job(problem: Problem, plan: SeqPlan, model: str | ModelSpec = "tiny", **settings) -> Job:
    """The job for `plan`: rules 1–4 checked against the problem, the model chosen (`tiny`,
    the problem's own, or a given spec — a checkpoint's), the plan scaled to it; seq_len,
    micro-batch and recompute default to the problem's training (seq_len: the tiny one)."""
    violations = structural_violations(problem, MemberTable.of(plan))
    if violations:
        raise RunError("the plan is invalid for this problem: " + "; ".join(str(v) for v in violations))
    training = problem.training
    spec = model if isinstance(model, ModelSpec) else (
        tiny_sequence_model(problem.model, plan) if model == "tiny" else problem.model)
    settings.setdefault("seq_len", tiny_seq_len(plan, seq_len=training.seq_len, token_block=training.token_block)
                        if model == "tiny" else training.seq_len)
    if model == "tiny" and settings["seq_len"] > TINY_MAX_SEQ_LEN:  # shares then only approximately kept
        settings["seq_len"] = max(TINY_MAX_SEQ_LEN, max(2 * sum(-(-len(g.members) // 2) for g in r.ring)
                                                        for r in plan.replicas))
    settings.setdefault("micro_batch", training.micro_batch)
    settings.setdefault("recompute", training.recompute)
    if "schedule" in settings:  # refused, not ignored: a sequence plan has no pipeline to schedule
        raise RunError("schedule: a sequence plan has no pipeline schedule")
    settings["schedule"] = training.schedule  # unused; the problem's, so nothing reports an override
    config = RunConfig(model=spec, **settings)
    scaled = scale_plan(plan, source=problem.model, target=spec, source_len=training.seq_len,
                        target_len=config.seq_len)
    problems = run_violations(scaled, spec, config.seq_len)
    if problems:
        raise RunError(f"the plan cannot run model {spec.name!r} at seq_len {config.seq_len}: " + "; ".join(problems))
    return Job(plan=scaled, config=config, problem=problem,
               problem_hash=problem_hash(problem))


def sequence_devices(plan: SeqPlan) -> list[int]:
    """The plan's devices in rank order (replica → group → member), one process each."""
    return plan.devices


def with_model(job: Job, model: ModelSpec) -> Job:
    """The job training `model` instead (a checkpoint's, same seq_len): the plan's head shares
    scaled to its kv heads; RunError if a share does not scale to whole kv heads."""
    config = job.config
    scaled = scale_plan(job.plan, source=config.model, target=model, source_len=config.seq_len,
                        target_len=config.seq_len)
    problems = run_violations(scaled, model, config.seq_len)
    if problems:
        raise RunError("; ".join(problems))
    return job.model_copy(update={"plan": scaled, "config": config.model_copy(update={"model": model})})

