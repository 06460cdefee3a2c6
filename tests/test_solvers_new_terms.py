"""Every registered solver of both plan kinds prices its plan as the evaluator does
(`objective_s == evaluate(problem, plan).iteration_s`) on problems that carry the terms of
docs/cost-model.md §3 the older code lacked: causal attention at its own efficiency
(η_att ≠ η), a Qwen2-style model with qkv biases, a model with tied embeddings, sequence
parallelism and ZeRO-1. The layered exact solvers' optima against brute force on such
problems are tests/test_exact_tied_zero.py's."""

from __future__ import annotations

import pytest

from planner import Plan, Problem, evaluate, load_problem, validate
from planner.hardware import GpuType
from planner.workload import ModelSpec
from solvers.common import SolverOptions
from solvers.registry import SOLVERS_BY_KIND, solve

OPTIONS = SolverOptions(time_limit_s=20, seed=1)
# A100s whose attention kernel reaches a third of peak, RTX4090s whose attention beats their GEMMs
SLOW_ATTENTION = (GpuType(name="A100-80G", vendor="nvidia", peak_tflops=312.0, memory_gib=80,
                          efficiency=0.5, attention_efficiency=0.17),
                  GpuType(name="RTX4090", vendor="nvidia", peak_tflops=165.2, memory_gib=24,
                          efficiency=0.4, attention_efficiency=0.6))
QWEN_STYLE = ModelSpec(name="qwen-tiny", layers=6, hidden=64, heads=4, kv_heads=2, ffn_hidden=172,
                       vocab=256, qkv_bias=True)
TIED = ModelSpec(name="tied-tiny", layers=6, hidden=64, heads=4, kv_heads=2, ffn_hidden=172,
                 vocab=256, tied_embeddings=True)


def _variant(name: str, base: str):
    # built anew, not model_copy'd: a copy would keep the original's cached per-machine arrays
    data = load_problem(base).model_dump()
    data["name"] = f"{base}-{name}"
    data["cluster"]["gpu_types"] = [g.model_dump() for g in SLOW_ATTENTION]
    if name in ("qwen", "tied"):
        data["model"] = (QWEN_STYLE if name == "qwen" else TIED).model_dump()
    if name == "sp-zero":
        data["training"].update(sequence_parallel=True, zero_stage=1)
    return Problem.model_validate(data)


VARIANTS = ("eta-att", "qwen", "tied", "sp-zero")
CASES = [("layered", solver, v) for solver in SOLVERS_BY_KIND["layered"] for v in VARIANTS]
CASES += [("sequence", solver, v) for solver in SOLVERS_BY_KIND["sequence"] for v in VARIANTS]
BASE = {"layered": "tiny-4-tiny-mha", "sequence": "longctx-tiny"}


def test_the_variants_really_differ():
    """Each variant changes the cost model's answer for the same plan (else it tests nothing)."""
    base = load_problem("tiny-4-tiny-mha")
    # two pipelines (a sync for ZeRO-1 and the tied copies to change), one of two stages, a TP-2 stage
    plan = Plan.model_validate({"pipelines": [
        {"batch": 8, "stages": [{"devices": [0, 1], "layers": 3}, {"devices": [2], "layers": 3}]},
        {"batch": 4, "stages": [{"devices": [3], "layers": 6}]}]})

    def figures(problem):
        return [(s.compute_s, s.dp_s, s.memory_gib) for s in evaluate(problem, plan).stages]
    for name in VARIANTS:
        assert figures(_variant(name, "tiny-4-tiny-mha")) != figures(base), name


@pytest.mark.parametrize("kind,solver,variant", CASES)
def test_objective_is_the_evaluators(kind, solver, variant):
    problem = _variant(variant, BASE[kind])
    result = solve(problem, solver, OPTIONS, kind=kind)
    if result.plan is None:
        pytest.fail(f"{solver} found no plan: {result.status} {result.message}")
    assert validate(problem, result.plan) == []
    assert result.objective_s == pytest.approx(evaluate(problem, result.plan).iteration_s, rel=1e-6)


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_replicas_fitting_is_the_largest_d_whose_states_fit(zero_stage):
    """The heuristic's bound on D counts ZeRO-1's optimizer state once across the D pipelines:
    the D it returns fits (D·μ_σ(D)·P ≤ usable, μ_σ from the cost model) and D + 1 does not."""
    from planner.layered.cost import replicas_fitting, state_bytes_per_param

    problem = _variant("sp-zero" if zero_stage else "eta-att", "tiny-4-tiny-mha")
    model, training = problem.model, problem.training
    for usable in (3e5, 1.1e6, 4.4e6, 2e7):
        d = replicas_fitting(model, training, usable)

        def fits(n):
            return n * float(state_bytes_per_param(training, n)) * model.total_params <= usable
        assert (d == 0 or fits(d)) and not fits(d + 1), (usable, d)
