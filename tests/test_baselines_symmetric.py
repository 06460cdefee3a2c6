"""The Megatron-style symmetric baselines: the layouts they build, the rules they follow,
and the best layout checked against a brute-force enumeration written independently."""

from __future__ import annotations

import itertools

import pytest

from planner import Cluster, Machine, ModelSpec, Pipeline, Plan, Problem, Stage, TrainingSpec, evaluate
from planner.io import load_problem
from planner.layered.validate import validate
from solvers.layered.baselines.symmetric import SymmetricLayout, layout_plan, tp_blocks
from solvers.common import SolverOptions
from solvers.registry import solve


def make_problem(counts, gpus, layers=8, batch=16, heads=8, kv=8, hidden=1024) -> Problem:
    machines = tuple(Machine(name=f"m{i}", gpu=g, count=c, intra_bw_gbps=100.0 if g.startswith("A") else 16.0)
                     for i, (c, g) in enumerate(zip(counts, gpus)))
    return Problem(
        name="sym-test",
        cluster=Cluster(machines=machines, inter_bw_gbps=5.0),
        model=ModelSpec(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=4 * hidden, vocab=8000),
        training=TrainingSpec(seq_len=512, global_batch=batch, micro_batch=1),
    )


def test_blocks_stay_inside_machines_and_skip_leftovers():
    problem = make_problem([6, 4], ["A100-80G", "RTX4090"])
    # machine 0 holds devices 0-5: one block of 4 (4, 5 left over), machine 1 holds 6-9
    assert tp_blocks(problem, 4) == [(0, 1, 2, 3), (6, 7, 8, 9)]
    assert tp_blocks(problem, 2) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def test_rank_orders_place_blocks_as_megatron_numbers_ranks():
    problem = make_problem([4, 4], ["A100-80G", "A100-80G"])
    default = layout_plan(problem, SymmetricLayout(dp=2, pp=2, tp=2, order="tp-dp-pp"))
    # tp-dp-pp: consecutive blocks are the same stage of different pipelines
    assert [[s.devices for s in p.stages] for p in default.pipelines] == [[(0, 1), (4, 5)], [(2, 3), (6, 7)]]
    alt = layout_plan(problem, SymmetricLayout(dp=2, pp=2, tp=2, order="tp-pp-dp"))
    assert [[s.devices for s in p.stages] for p in alt.pipelines] == [[(0, 1), (2, 3)], [(4, 5), (6, 7)]]
    assert all(p.batch == 8 and [s.layers for s in p.stages] == [4, 4] for p in alt.pipelines)


def brute_force_best(problem: Problem, use_all: bool) -> float:
    """Min T over every symmetric plan, enumerated from the rules alone."""
    cluster, model, training = problem.cluster, problem.model, problem.training
    n, best = cluster.num_devices, float("inf")
    for dp, pp, tp in itertools.product(range(1, n + 1), repeat=3):
        if dp * pp * tp > n or (use_all and dp * pp * tp != n):
            continue
        if tp & (tp - 1) or model.heads % tp or model.num_kv_heads % tp or model.layers % pp:
            continue
        if training.global_batch % (dp * training.micro_batch):
            continue
        groups = []  # tp-groups machine by machine in file order
        for m in range(len(cluster.machines)):
            devs = cluster.devices_of(m)
            groups += [tuple(devs[i:i + tp]) for i in range(0, len(devs) - tp + 1, tp)]
        if use_all and len(groups) * tp != n or len(groups) < dp * pp:
            continue
        for stage_major in (True, False):
            pipes = []
            for p in range(dp):
                idx = [k * dp + p if stage_major else p * pp + k for k in range(pp)]
                pipes.append(Pipeline(batch=training.global_batch // dp,
                                      stages=tuple(Stage(devices=groups[i], layers=model.layers // pp) for i in idx)))
            plan = Plan(pipelines=tuple(pipes))
            if not validate(problem, plan):
                best = min(best, evaluate(problem, plan).iteration_s)
    return best


@pytest.mark.parametrize("counts,gpus", [([4, 4], ["A100-80G", "RTX4090"]), ([2, 4, 2], ["RTX3090", "A100-80G", "RTX4090"])])
def test_best_layout_matches_brute_force(counts, gpus):
    problem = make_problem(counts, gpus)
    for name, use_all in (("symmetric", False), ("symmetric-all", True)):
        result = solve(problem, name)
        expected = brute_force_best(problem, use_all)
        assert result.objective_s == pytest.approx(expected, rel=1e-12)
        assert evaluate(problem, result.plan).iteration_s == pytest.approx(result.objective_s, rel=1e-12)


def test_plans_are_symmetric_valid_and_all_uses_every_device():
    problem = load_problem("small-8-llama2-7b")
    some, every = solve(problem, "symmetric"), solve(problem, "symmetric-all")
    for result in (some, every):
        plan = result.plan
        assert validate(problem, plan) == []
        assert len({s.tp for p in plan.pipelines for s in p.stages}) == 1
        assert len({s.layers for p in plan.pipelines for s in p.stages}) == 1
        assert len({p.batch for p in plan.pipelines}) == 1
        assert len({len(p.stages) for p in plan.pipelines}) == 1
        assert plan.solver.name == result.solver and result.status.value == "feasible"
    assert sorted(every.plan.devices) == list(range(problem.cluster.num_devices))
    assert some.objective_s <= every.objective_s  # the free variant searches a superset


def test_symmetric_all_has_no_layout_when_the_cluster_size_cannot_factor():
    # 24 GPUs = 3·8: dp·pp·tp = 24 needs a factor 3, but dp | 128 and pp | 32 and tp is a power of 2
    problem = make_problem([8, 8, 8], ["A100-80G"] * 3, layers=32, batch=128)
    result = solve(problem, "symmetric-all")
    assert result.status.value == "infeasible" and result.plan is None
    assert "no symmetric layout exists" in result.message
    assert solve(problem, "symmetric").status.value == "feasible"


def test_out_of_memory_everywhere_is_reported_infeasible():
    # 2 layers of h=16384 (P_layer = 16h² with f = 4h) on one 24 GiB card: states alone are
    # μ·2·16h² = 16·2·16·16384² ≈ 137 GB
    problem = make_problem([1], ["RTX4090"], layers=2, batch=2, hidden=16384, heads=128, kv=128)
    result = solve(problem, "symmetric")
    assert result.status.value == "infeasible"
    assert "fits in memory" in result.message


def test_limits_on_pipelines_and_stages_are_respected():
    problem = make_problem([4, 4], ["A100-80G", "RTX4090"])
    result = solve(problem, "symmetric", SolverOptions(max_pipelines=1, max_stages=2))
    assert len(result.plan.pipelines) == 1 and len(result.plan.pipelines[0].stages) <= 2


@pytest.mark.parametrize("seed", range(6))
def test_the_memory_check_before_the_plan_is_validates(seed):
    """The search drops a layout that does not fit before building its plan (`fits_memory` on
    the stage table of its blocks): its verdict must be `validate`'s on the plan, for every
    layout of clusters of mixed memory (24 GB to 141 GB), models of 7B to 70B, ZeRO-1 or not,
    both rank orders; and both verdicts must occur."""
    from instances.generate import generate_cluster, generated_problem
    from planner.layered.table import stage_table
    from planner.workload import TrainingSpec as Training
    from solvers.layered.baselines.symmetric import candidate_layouts, fits_memory, layout_table

    mix = ["A100-80G:1,RTX4090:1", "H20:1,RTX3090:1", "H100:1,L40S:1"][seed % 3]
    problem = generated_problem(generate_cluster(64, mix, seed), ["llama2-7b", "llama2-13b", "llama2-70b"][seed % 3])
    if seed % 2:
        problem = problem.model_copy(update={"training": Training(**{**problem.training.model_dump(), "zero_stage": 1})})
    verdicts = set()
    for layout in candidate_layouts(problem, False, SolverOptions()):
        plan = layout_plan(problem, layout)
        ours, theirs = layout_table(problem, layout), stage_table(problem, plan)
        assert all((getattr(ours, f) == getattr(theirs, f)).all() for f in ("machine", "tp", "layers", "batch", "pipe"))
        fits = fits_memory(problem, layout)
        assert fits == (not validate(problem, plan)), layout
        verdicts.add(fits)
    assert verdicts == {True, False}, seed
