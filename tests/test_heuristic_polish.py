"""The heuristic's exact pieces: the polish ends at a local optimum (checked by brute force
over every single layer / micro-batch move, with Plan objects and the public evaluator),
the batch split is optimal for the slowest pipeline, and the memory repair fixes an
out-of-memory stage while keeping as many layers there as fit."""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path

import numpy as np
import pytest

from planner.layered.pricing import breakdown, iteration_time
from planner.hardware import Cluster, Machine
from planner.io import load_model, load_plan, load_problem
from planner.layered.plan import Pipeline, Plan, Stage
from planner.problem import Problem
from planner.layered.table import stage_table
from planner.layered.validate import validate
from planner.workload import TrainingSpec
from solvers.layered.heuristic import build_plan, partition, polish
from solvers.layered.heuristic.assemble import plan_from_table, repair_memory, split_batches, with_split


def single_moves(plan: Plan):
    """Every plan one layer or one micro-batch away from `plan` (n ≥ 1, m ≥ 1)."""
    pipes = list(plan.pipelines)
    for p, pipe in enumerate(pipes):
        for i, j in itertools.permutations(range(len(pipe.stages)), 2):
            if pipe.stages[i].layers > 1:
                stages = list(pipe.stages)
                stages[i] = Stage(devices=stages[i].devices, layers=stages[i].layers - 1)
                stages[j] = Stage(devices=stages[j].devices, layers=stages[j].layers + 1)
                yield plan.model_copy(update={"pipelines": tuple(
                    pipes[:p] + [Pipeline(batch=pipe.batch, stages=tuple(stages))] + pipes[p + 1:])})
    for p, q in itertools.permutations(range(len(pipes)), 2):
        yield (p, q)


def moved_batch(plan: Plan, p: int, q: int, micro: int) -> Plan | None:
    pipes = list(plan.pipelines)
    if pipes[p].batch <= micro:
        return None
    pipes[p] = Pipeline(batch=pipes[p].batch - micro, stages=pipes[p].stages)
    pipes[q] = Pipeline(batch=pipes[q].batch + micro, stages=pipes[q].stages)
    return plan.model_copy(update={"pipelines": tuple(pipes)})


def best_neighbour(problem: Problem, plan: Plan) -> float:
    best = np.inf
    for move in single_moves(plan):
        other = moved_batch(plan, *move, problem.training.micro_batch) if isinstance(move, tuple) else move
        if other is not None and not validate(problem, other):
            best = min(best, iteration_time(problem, other))
    return best


def scrambled(problem: Problem, plan: Plan, seed: int) -> Plan:
    """The same structure with a random (valid-sum) layer and batch split."""
    rng = np.random.default_rng(seed)
    big_l, micro = problem.model.layers, problem.training.micro_batch
    d = len(plan.pipelines)
    m = 1 + rng.multinomial(problem.training.micro_batches - d, np.ones(d) / d)
    pipes = []
    for pipe, mp in zip(plan.pipelines, m):
        s = len(pipe.stages)
        n = 1 + rng.multinomial(big_l - s, np.ones(s) / s)
        pipes.append(Pipeline(batch=int(mp) * micro, stages=tuple(
            Stage(devices=st.devices, layers=int(k)) for st, k in zip(pipe.stages, n))))
    return plan.model_copy(update={"pipelines": tuple(pipes)})


@pytest.mark.parametrize("name,pools,seed", [("small-8-llama2-7b", 2, 0), ("tiny-6-llama3-8b", 2, 1),
                                             ("medium-32-llama2-13b", 3, 2), ("small-16-llama2-13b", 2, 3)])
def test_polish_stops_at_a_local_optimum(name, pools, seed):
    problem = load_problem(name)
    plan = build_plan(problem, partition(problem, pools, partitioner="metis", protect="pipeline", seed=0))
    start = scrambled(problem, plan, seed)
    table = stage_table(problem, start)
    fits = repair_memory(problem, table)  # the solver repairs memory before it polishes
    table = with_split(table, fits, table.batch // problem.training.micro_batch, problem.training.micro_batch)
    start = plan_from_table(problem, start, table)
    assert validate(problem, start) == []
    layers, micro, b = polish(problem, table)
    result = plan_from_table(problem, start, with_split(table, layers, micro, problem.training.micro_batch))
    assert validate(problem, result) == []
    t = iteration_time(problem, result)
    assert t == pytest.approx(b.iteration)
    assert t <= iteration_time(problem, start)
    assert best_neighbour(problem, result) >= t * (1 - 1e-12)


def test_screened_polish_for_large_plans_improves_and_stays_valid():
    """With exhaustive checking off (as on hundreds of pipelines), the polish tries only
    moves that touch the bottleneck; it must still lower T and keep every rule."""
    problem = load_problem("medium-32-llama2-13b")
    plan = build_plan(problem, partition(problem, 4, partitioner="metis", protect="pipeline", seed=0))
    start = scrambled(problem, plan, 5)
    table = stage_table(problem, start)
    fits = repair_memory(problem, table)
    table = with_split(table, fits, table.batch // problem.training.micro_batch, problem.training.micro_batch)
    before = breakdown(problem, table).iteration
    layers, micro, b = polish(problem, table, exhaustive_moves=0)
    result = plan_from_table(problem, start, with_split(table, layers, micro, problem.training.micro_batch))
    assert validate(problem, result) == []
    assert iteration_time(problem, result) == pytest.approx(b.iteration)
    assert b.iteration < before


def test_batch_split_minimises_the_slowest_pipeline():
    """Against every split of the micro-batches over the pipelines (brute force)."""
    problem = load_problem("small-8-llama2-7b")
    plan = build_plan(problem, partition(problem, 3, partitioner="metis", protect="pipeline", seed=0))
    table = stage_table(problem, plan)
    micro = split_batches(problem, table, equal=False)
    total, d, b = problem.training.micro_batches, table.num_pipelines, problem.training.micro_batch

    def slowest(m):
        pipes = tuple(Pipeline(batch=int(k) * b, stages=p.stages) for p, k in zip(plan.pipelines, m))
        t = stage_table(problem, plan.model_copy(update={"pipelines": pipes}))
        return breakdown(problem, t).pipe_time.max()

    every = [c for c in itertools.product(range(1, total + 1), repeat=d) if sum(c) == total]
    assert slowest(micro) == pytest.approx(min(slowest(c) for c in every))


def memory_tight_problem() -> Problem:
    cluster = Cluster(machines=(
        Machine(name="big", gpu="A100-80G", count=2, intra_bw_gbps=300),
        Machine(name="small", gpu="RTX4090", count=1, intra_bw_gbps=16),
    ), inter_bw_gbps=12.5)
    return Problem(cluster=cluster, model=load_model("llama2-7b"),
                   training=TrainingSpec(seq_len=4096, global_batch=8, micro_batch=1))


def test_memory_repair_moves_layers_off_the_full_stage():
    problem = memory_tight_problem()
    # the 24 GiB RTX4090 cannot hold 20 of the 32 layers (16 bytes of state per parameter)
    plan = Plan(pipelines=(Pipeline(batch=8, stages=(
        Stage(devices=(0,), layers=6), Stage(devices=(1,), layers=6), Stage(devices=(2,), layers=20))),))
    assert [v.rule for v in validate(problem, plan)] == ["memory"]
    table = stage_table(problem, plan)
    fixed = repair_memory(problem, table)
    repaired = plan_from_table(problem, plan, with_split(table, fixed, table.batch, 1))
    assert validate(problem, repaired) == []
    # the small stage keeps as many layers as fit: one more and it is out of memory again
    n_small = repaired.pipelines[0].stages[2].layers
    assert 1 <= n_small < 20
    big = [s.layers for s in repaired.pipelines[0].stages[:2]]
    assert abs(big[0] - big[1]) <= 1  # the layers went to the less loaded of equal stages
    one_more = Plan(pipelines=(Pipeline(batch=8, stages=(
        Stage(devices=(0,), layers=big[0]), Stage(devices=(1,), layers=big[1] - 1),
        Stage(devices=(2,), layers=n_small + 1))),))
    assert [v.rule for v in validate(problem, one_more)] == ["memory"]


def test_memory_repair_reports_a_pool_that_cannot_hold_the_model():
    problem = memory_tight_problem()
    plan = Plan(pipelines=(Pipeline(batch=8, stages=(Stage(devices=(2,), layers=32),)),))
    assert repair_memory(problem, stage_table(problem, plan)) is None
    assert build_plan(problem, [[2]]) is None


PLATEAU = Path(__file__).parent / "data" / "h800-h20-16-24-merged-unpolished.json"


def test_on_a_plateau_of_t_a_layer_move_lets_a_micro_batch_follow(monkeypatch):
    """h800-h20-16-24 after the heuristic's merge of the H20 pipeline's two t = 2 stages, as
    assembled: the H800 pipeline is the slowest (T 68.7545 s). No single move lowers T: a
    micro-batch more slows the H20 pipeline past it, a layer moved inside the H20 pipeline
    leaves T as it is. Taking that layer move for the pipelines' summed time (`slack_gain`), a
    micro-batch then follows: 68.659 s. Without the tie-break the polish stops where it starts."""
    polish_module = importlib.import_module("solvers.layered.heuristic.polish")
    problem, start = load_problem("h800-h20-16-24-llama2-70b"), load_plan(PLATEAU)
    table = stage_table(problem, start)
    assert iteration_time(problem, start) == pytest.approx(68.75447, abs=1e-4)
    layers, micro, b = polish(problem, table)
    assert b.iteration == pytest.approx(68.65902, abs=1e-4)
    assert list(micro) != list(table.batch // problem.training.micro_batch)  # a micro-batch moved
    assert validate(problem, plan_from_table(problem, start, with_split(table, layers, micro, 1))) == []
    monkeypatch.setattr(polish_module, "slack_gain", lambda before, after: 0.0)
    assert polish(problem, table)[2].iteration == pytest.approx(68.75447, abs=1e-4)


def test_structure_moves_rank_ties_in_t_by_the_pipelines_summed_time():
    """The merged structure above ties with the plan it came from on T; ranked by T alone, it was
    one of many ties listed after the POLISHED_PER_ROUND that get polished."""
    from solvers.layered.heuristic.moves import _Limits, structure_of

    problem, merged = load_problem("h800-h20-16-24-llama2-70b"), load_plan(PLATEAU)
    slower_h20 = merged.model_copy(update={"pipelines": (merged.pipelines[0], merged.pipelines[1].model_copy(
        update={"stages": merged.pipelines[1].stages[:-2] + (
            Stage(devices=merged.pipelines[1].stages[-2].devices[:2], layers=merged.pipelines[1].stages[-2].layers),
            Stage(devices=merged.pipelines[1].stages[-2].devices[2:], layers=1),
            Stage(devices=merged.pipelines[1].stages[-1].devices, layers=merged.pipelines[1].stages[-1].layers - 1))}))})
    limits = _Limits(problem, float("inf"), (None, None, None), {}, 10)
    ranked = limits.ranked([structure_of(problem, slower_h20), structure_of(problem, merged)])
    times = [breakdown(problem, stage_table(problem, plan)) for _, _, plan in ranked]
    assert times[0].iteration == pytest.approx(times[1].iteration)  # tied on T
    assert np.sum(times[0].pipe_time) < np.sum(times[1].pipe_time)
    assert len(ranked[0][2].pipelines[1].stages) == 6  # the merged one first, though listed second
