"""A layered plan's job (no torch): the plan checked against the problem, the model actually
trained (`tiny_model` or the problem's own) and the run settings, defaults from the problem.

`tiny_model` shrinks a problem's model for a small-scale run of any plan: it keeps the layer
count L (the plan's layer split stays valid) and makes heads, kv heads, ffn hidden and the
vocabulary divisible by every TP size of the plan (the plan's TP groups stay valid).
"""

from __future__ import annotations

from planner.layered.plan import Plan
from planner.layered.rules import structural_violations
from planner.problem import Problem
from planner.workload import ModelSpec
from runtime.checkpoints.manifest import problem_hash
from runtime.config import BYTE_VOCAB, Job, RunConfig, check_model_fits, check_sequence_parallel
from runtime.errors import RunError
from runtime.layered.layout import rank_layout

TINY_HEAD_DIM = 8
TINY_MIN_HIDDEN = 32
TINY_MAX_SEQ_LEN = 32


def _tiny_heads(model: ModelSpec, tp_max: int) -> tuple[int, int]:
    """kv heads: a multiple of the largest TP size; query heads keep the model's GQA ratio
    (capped at 2); at least TINY_MIN_HIDDEN hidden units."""
    ratio, kv_heads = min(model.heads // model.num_kv_heads, 2), tp_max
    while kv_heads * ratio * TINY_HEAD_DIM < TINY_MIN_HIDDEN:
        kv_heads *= 2
    return kv_heads * ratio, kv_heads


def tiny_model(model: ModelSpec, plan: Plan) -> ModelSpec:
    """A small model with the same L whose sizes every TP group of `plan` can split."""
    tp_max = max(s.tp for p in plan.pipelines for s in p.stages)
    heads, kv_heads = _tiny_heads(model, tp_max)
    hidden = heads * TINY_HEAD_DIM
    multiple = max(tp_max, 8)  # plans with TP ≤ 8 (and the same kv heads) get the same model
    ffn = -(-(8 * hidden // 3) // multiple) * multiple  # ≈ 8h/3 as in Llama
    vocab = max(BYTE_VOCAB, tp_max)
    return ModelSpec(name=f"tiny({model.name})", layers=model.layers, hidden=hidden, heads=heads,
                     kv_heads=kv_heads, ffn_hidden=ffn, vocab=vocab, gated=model.gated)


def make_layered_job(problem: Problem, plan: Plan, model: str | ModelSpec = "tiny", **settings) -> Job:
    """The job for `plan`: structure checked, model chosen (`tiny`, the problem's own, or a
    given spec — a checkpoint's, whose seq_len the caller passes); seq_len, micro-batch, recompute and schedule default to
    the problem's training."""
    violations = structural_violations(problem, plan)
    if violations:
        raise RunError("the plan is invalid for this problem: "
                               + "; ".join(str(v) for v in violations))
    spec = model if isinstance(model, ModelSpec) else tiny_model(problem.model, plan) if model == "tiny" else problem.model
    check_model_fits(spec, [s.tp for p in plan.pipelines for s in p.stages])
    training = problem.training
    settings.setdefault("seq_len", min(training.seq_len, TINY_MAX_SEQ_LEN) if model == "tiny" else training.seq_len)
    settings.setdefault("micro_batch", training.micro_batch)
    settings.setdefault("recompute", training.recompute)
    settings.setdefault("schedule", training.schedule)
    settings.setdefault("sequence_parallel", training.sequence_parallel)  # §3.5, priced by the plan
    settings.setdefault("zero_stage", training.zero_stage)  # §11
    config = RunConfig(model=spec, **settings)
    check_sequence_parallel(config.seq_len, config.sequence_parallel, [s.tp for p in plan.pipelines for s in p.stages])
    return Job(plan=plan, config=config, problem=problem, problem_hash=problem_hash(problem))


def rank_devices(plan: Plan) -> list[int]:
    """The plan's devices in rank order (one process each)."""
    return [d for stage in rank_layout(plan).stages for d in stage.devices]


def with_model(job: Job, model: ModelSpec) -> Job:
    """The job training `model` instead (a checkpoint's); ValueError if a TP size cannot split it."""
    check_model_fits(model, [s.tp for p in job.plan.pipelines for s in p.stages])
    return job.model_copy(update={"config": job.config.model_copy(update={"model": model})})

