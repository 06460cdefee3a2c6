"""The heuristic solver end to end: every plan valid on random clusters (4–256 GPUs),
deterministic per seed, and as good as brute force on problems small enough to enumerate."""

from __future__ import annotations

from collections import Counter
from unittest.mock import patch

import numpy as np
import pytest

from instances.generate import generate_cluster, generated_problem
from planner.layered.pricing import iteration_time
from planner.io import load_problem
from planner.solver_info import SolveStatus
from planner.layered.plan import Plan, devices_in_order
from planner.layered.table import stage_table
from planner.layered.validate import validate
from solvers import registry
from solvers.common import SolverOptions
from solvers.layered.exact import brute
from solvers.layered.composed import solve_heuristic as solve  # the registry's: search + exact refinement
from solvers.layered.heuristic import HeuristicOptions, build_plan, partition, solve_with
from solvers.layered.heuristic.assemble import plan_from_table
from solvers.layered.heuristic.search import Search

MIXES = ["A100-80G:1,RTX4090:1", "H800:1,H20:1", "RTX3090:2,RTX4090:1,L40S:1", "A800-80G:1",
         "V100:1,T4:1,A10:1"]
MODELS = ["llama2-7b", "llama2-13b", "tiny", "llama3-8b"]
SIZES = [4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]  # seeds 0..11 cover each once


def random_problem(seed: int):
    """A generated cluster of 4–256 GPUs with a bundled model and a random batch."""
    rng = np.random.default_rng(seed)
    gpus = SIZES[seed % len(SIZES)]
    cluster = generate_cluster(gpus, MIXES[seed % len(MIXES)], seed=seed)
    micro = int(rng.choice([1, 2]))
    batch = micro * int(rng.integers(1, 2 * gpus + 1))
    return generated_problem(cluster, MODELS[seed % len(MODELS)], seq_len=int(rng.choice([1024, 4096])),
                             global_batch=batch, micro_batch=micro)


@pytest.mark.parametrize("seed", range(12))
def test_every_returned_plan_is_valid(seed):
    problem = random_problem(seed)
    result = solve(problem, SolverOptions(seed=seed, time_limit_s=2))  # any returned plan must be valid: no need to search long
    if result.status == SolveStatus.infeasible:
        # only when not even the whole cluster holds the model states
        total = sum(m.count * problem.cluster.gpu_of(i).memory_gib for i, m in enumerate(problem.cluster.machines))
        assert total * 2**30 < 4 * problem.training.param_state_bytes * problem.model.total_params
        return
    assert result.plan is not None
    assert validate(problem, result.plan) == []
    assert result.objective_s == pytest.approx(iteration_time(problem, result.plan))


@pytest.mark.parametrize("seed", [3, 7])
def test_random_partition_baseline_plans_are_valid(seed):
    problem = random_problem(seed)
    result = solve_with(problem, SolverOptions(seed=seed, time_limit_s=5), HeuristicOptions(partitioner="random"))
    assert result.plan is not None and validate(problem, result.plan) == []


def test_ablations_keep_their_restriction():
    problem = load_problem("medium-32-llama2-13b")
    one_tp = solve_with(problem, SolverOptions(), HeuristicOptions(fixed_tp=2)).plan
    assert validate(problem, one_tp) == []
    assert {s.tp for p in one_tp.pipelines for s in p.stages} == {2}
    equal = solve_with(problem, SolverOptions(), HeuristicOptions(equal_batch=True)).plan
    assert validate(problem, equal) == []
    batches = [p.batch for p in equal.pipelines]
    assert max(batches) - min(batches) <= problem.training.micro_batch


def test_same_seed_same_plan():
    """Every phase runs (24 GPUs: the moves, the other D's and the family starts); a work limit
    of 800 shapes instead of the 9,600 of a 60 s limit: the same code, a third of the time."""
    problem = random_problem(4)
    options = SolverOptions(seed=11, time_limit_s=60)
    default = HeuristicOptions(move_evaluations=800)
    assert solve_with(problem, options, default).plan.pipelines == solve_with(problem, options, default).plan.pipelines
    heuristic = HeuristicOptions(partitioner="random")
    a = solve_with(problem, options, heuristic).plan
    assert a.pipelines == solve_with(problem, options, heuristic).plan.pipelines


def test_phase_two_uses_only_pool_devices():
    problem = load_problem("case-study-llama2-13b")
    pools = partition(problem, 3, partitioner="metis", protect="pipeline", seed=0)
    assert sorted(np.concatenate(pools).tolist()) == list(range(problem.cluster.num_devices))
    plan = build_plan(problem, pools)
    assert validate(problem, plan) == []
    owner = {int(d): i for i, pool in enumerate(pools) for d in pool}
    for pipe in plan.pipelines:  # a pipeline never mixes pools
        assert len({owner[d] for s in pipe.stages for d in s.devices}) == 1


def test_one_plan_assembly_round_trips_through_the_stage_table():
    """`Plan.from_stages` (the one constructor every solver uses) and `plan_from_table`
    rebuild the heuristic's plan exactly from its stage table; `devices_in_order` hands each
    machine's devices out in id order."""
    problem = load_problem("case-study-llama2-13b")
    plan = build_plan(problem, partition(problem, 2, partitioner="metis", protect="pipeline", seed=0))
    table = stage_table(problem, plan)
    assert plan_from_table(problem, plan, table) == plan
    again = Plan.from_stages(problem=plan.problem, batches=[p.batch for p in plan.pipelines],
                             stages=[[(s.devices, s.layers) for s in p.stages] for p in plan.pipelines])
    assert again == plan
    assert [f.tolist() for f in table.per_pipeline(table.first_layer)] == [
        [a for a, _ in p.layer_ranges()] for p in plan.pipelines]
    first = problem.cluster.first_device
    assert devices_in_order(first, [[(1, 2), (0, 1)], [(1, 1)]]) == [
        [(first[1], first[1] + 1), (first[0],)], [(first[1] + 2,)]]
    with pytest.raises(ValueError):
        Plan.from_stages(problem="", batches=[1, 1], stages=[[((0,), 1)]])


def test_registered_and_reached_by_name():
    problem = load_problem("small-8-llama2-7b")
    by_name = registry.solve(problem, "heuristic")
    assert by_name.solver == "heuristic"
    assert by_name.plan.pipelines == solve(problem, SolverOptions()).plan.pipelines


@pytest.mark.parametrize("name", ["tiny-2-tiny", "demo-tiny", "tiny-4-tiny-mha"])
def test_matches_brute_force_on_tiny_problems(name):
    """Brute force enumerates every valid plan (solvers/exact/brute.py); gap ≤ 3 %."""
    problem = load_problem(name)
    optimum = brute.solve(problem, SolverOptions(time_limit_s=120))
    assert optimum.status == SolveStatus.optimal
    found = solve(problem, SolverOptions())
    assert found.objective_s <= optimum.objective_s * 1.03
    assert found.objective_s >= optimum.objective_s * (1 - 1e-9)  # brute force is a true lower bound


def test_limits_on_pipelines_and_stages_are_kept():
    problem = load_problem("medium-32-llama2-13b")
    # the structure moves at their least work (400, not the 9,600 of the default 60 s): the limits
    # must hold through them, however long they search
    plan = solve_with(problem, SolverOptions(max_pipelines=2, max_stages=3), HeuristicOptions(move_evaluations=400)).plan
    assert validate(problem, plan) == []
    assert len(plan.pipelines) <= 2
    assert max(len(p.stages) for p in plan.pipelines) <= 3


def test_a_tiny_time_budget_still_returns_a_valid_plan():
    problem = random_problem(10)  # 192 GPUs
    result = solve(problem, SolverOptions(time_limit_s=0.01))
    assert result.plan is not None and validate(problem, result.plan) == []
    assert result.wall_s < 30


def test_one_tp_ablation_with_an_impossible_size_is_infeasible_not_invalid():
    problem = load_problem("tiny-4-tiny-mha")  # 4 heads: TP 8 cannot shard it
    result = solve_with(problem, SolverOptions(), HeuristicOptions(fixed_tp=8))
    assert result.status == SolveStatus.infeasible and result.plan is None
    with pytest.raises(ValueError, match="power of two"):
        HeuristicOptions(fixed_tp=3)


def test_a_merge_at_the_same_place_in_every_pipeline_is_a_neighbour():
    """Alike pipelines gain from a TP merge only together (T is a max over them): merging stages
    k and k + 1 of every pipeline is one move, offered where each pipeline's two are equal and on
    one machine; on 4×8 A800 (30B) it takes the heuristic below the plan read back from the
    configuration bound's tables (36.667 s, benchmarks/report/bounds.md), which the per-pipeline
    merge did not (37.24 s)."""
    from solvers.layered.heuristic.moves import _merges_everywhere
    from solvers.layered.heuristic.pipeline import StageSlot

    problem = load_problem("homo-a800-4x8-llama-30b")
    two = (StageSlot(0, (0,)), StageSlot(0, (1,)))
    other = (StageSlot(1, (8,)), StageSlot(1, (9,)))
    [merged] = list(_merges_everywhere(problem, (two, other)))
    assert merged == ((StageSlot(0, (0, 1)),), (StageSlot(1, (8, 9)),))
    across = (StageSlot(0, (2,)), StageSlot(1, (10,)))
    assert list(_merges_everywhere(problem, (two, across))) == []
    result = solve_with(problem, SolverOptions(time_limit_s=10, threads=1), HeuristicOptions())
    assert result.objective_s < 36.667


def test_the_structure_moves_work_grows_with_the_time_limit():
    """The default work limit is 160 structures per second of the time limit, never under 400;
    an explicit `move_evaluations` wins at any limit (0 turns the moves' search off)."""
    default = HeuristicOptions()
    assert [default.evaluations_for(t) for t in (0.5, 2.5, 10, 60)] == [400, 400, 1600, 9600]
    assert HeuristicOptions(move_evaluations=0).evaluations_for(60) == 0
    assert HeuristicOptions(move_evaluations=50).evaluations_for(10) == 50


def test_a_crossover_exchanges_two_pipelines_tails_and_keeps_every_stage():
    """Every cut of each of two pipelines, tails exchanged: (len_p − 1)(len_q − 1) neighbours per
    pair, the stages (as a multiset) and the number of pipelines unchanged. At a local optimum
    they take gen-40 seed 4 (A100-80G, RTX4090, H20; 13B) below the plan read back from the
    configuration bound's tables (5.9429 s, benchmarks/report/bounds.md); without them the moves
    stopped at 6.0070 s."""
    from solvers.layered.heuristic.moves import crossovers
    from solvers.layered.heuristic.pipeline import StageSlot

    a = tuple(StageSlot(0, (i,)) for i in range(3))
    b = tuple(StageSlot(1, (8 + i,)) for i in range(4))
    c = (StageSlot(2, (16,)),)
    out = crossovers((a, b, c))
    assert len(out) == (3 - 1) * (4 - 1)  # the one-stage pipeline has no cut
    for cand in out:
        assert len(cand) == 3 and Counter(s for p in cand for s in p) == Counter(a + b + c)
    assert (a[:1] + b[1:], b[:1] + a[1:], c) in out
    problem = generated_problem(generate_cluster(40, "A100-80G:1,RTX4090:1,H20:1", 4), "llama2-13b")  # bench_bounds' mix
    # D = 2, where the unrestricted search ends (5.8995 s either way; half the time)
    two = HeuristicOptions(move_evaluations=1600, pipelines=(2,))
    result = solve_with(problem, SolverOptions(time_limit_s=60, threads=1), two)
    assert result.objective_s < 5.9429


def test_idle_devices_of_one_type_join_every_pipeline_at_once():
    """Like the merges: a stage of idle devices of one GPU type at the same place in every
    pipeline (each pipeline its own devices, each stage inside one machine). On hetero-1 13B
    the moves had left half of the RTX 3080 Ti machine idle (31.21 s); now both pipelines hold
    all of it (30.81 s)."""
    from solvers.layered.heuristic.moves import _additions_everywhere, idle_devices
    from solvers.layered.heuristic.pipeline import StageSlot

    problem = load_problem("hetero1-llama2-13b")
    structure = ((StageSlot(2, (16,)),), (StageSlot(2, (17,)),))
    idle = idle_devices(problem, structure)
    out = list(_additions_everywhere(problem, structure, idle))
    assert out
    for cand in out:
        added = [next(s for s in pipe if s not in structure[p]) for p, pipe in enumerate(cand)]
        gpus = {problem.cluster.machines[s.machine].gpu for s in added}
        assert len(gpus) == 1 and len({d for s in added for d in s.devices}) == sum(s.tp for s in added)
        assert all(set(s.devices) <= set(idle[s.machine]) for s in added)
    # D = 2, where the unrestricted search ends (30.807 s either way)
    two = HeuristicOptions(move_evaluations=1600, pipelines=(2,))
    result = solve_with(problem, SolverOptions(time_limit_s=60, threads=1), two)
    assert result.objective_s < 31.0


@pytest.mark.parametrize("seed", [1, 2, 4, 6])  # 8–48 GPUs; each has other D's starts
def test_the_other_ds_starts_come_after_and_never_cost_the_plan(seed):
    """The best structure of each of the best few D that the best few structures leave out is
    moved only after them, with work of its own: the plan is never slower than without those
    starts, and (with the time to spare here) every start it adds is of a D the first ones lack."""
    problem = random_problem(seed)
    options, heuristic = SolverOptions(time_limit_s=30, threads=1), HeuristicOptions(move_evaluations=200)
    with_others = solve_with(problem, options, heuristic)
    search = Search(problem, options, heuristic)
    search.explore(None)
    first = {key[0] for key, _, _ in search.ranked()[: heuristic.polish_candidates]}
    others = search.other_d_starts()
    assert len(others) <= heuristic.polish_candidates
    key_of = {id(plan): key for key, _, plan in search.ranked()}
    assert all(key_of[id(plan)][0] not in first for plan in others)
    with patch.object(Search, "other_d_starts", lambda self: []):
        without = solve_with(problem, options, heuristic)
    assert with_others.objective_s <= without.objective_s * (1 + 1e-12)


@pytest.mark.parametrize("seed", [1, 4])
def test_the_family_starts_are_one_per_family_of_a_best_d_and_never_cost_the_plan(seed):
    """After the other D's starts, the best structure of each family of splits (the mode before
    "×") at each of the best few D that no earlier start holds is moved too, sharing one
    start's work: one start per (D, family), none an earlier start, and the plan never slower
    than without them (ties keep the earlier start)."""
    problem = random_problem(seed)
    options, heuristic = SolverOptions(time_limit_s=30, threads=1), HeuristicOptions(move_evaluations=200)
    search = Search(problem, options, heuristic)
    search.explore(None)
    ranked, count = search.ranked(), heuristic.polish_candidates
    best_ds = list(dict.fromkeys(key[0] for key, _, _ in ranked))[:count]
    key_of = {id(plan): key for key, _, plan in ranked}
    families = [(key_of[id(p)][0], key_of[id(p)][1].split("×")[0]) for p in search.family_starts()]
    assert families and len(set(families)) == len(families) and {d for d, _ in families} <= set(best_ds)
    earlier = [id(p) for _, _, p in ranked[:count]] + [id(p) for p in search.other_d_starts()]
    assert not {id(p) for p in search.family_starts()} & set(earlier)
    with_families = solve_with(problem, options, heuristic)
    with patch.object(Search, "family_starts", lambda self: []):
        without = solve_with(problem, options, heuristic)
    assert with_families.objective_s <= without.objective_s * (1 + 1e-12)


@pytest.mark.parametrize("seed", [1, 4])
def test_the_next_starts_follow_in_rank_order_and_never_cost_the_plan(seed):
    """Last, the next few structures in rank order that no start holds share the work the other
    starts left: as many as the first starts, each after the first ones in rank, none another
    start, and the plan never slower than without them (ties keep the earlier start)."""
    problem = random_problem(seed)
    options, heuristic = SolverOptions(time_limit_s=30, threads=1), HeuristicOptions(move_evaluations=300)
    search = Search(problem, options, heuristic)
    search.explore(None)
    ranked, count = search.ranked(), heuristic.polish_candidates
    later = search.other_d_starts() + search.family_starts()
    nexts = search.next_starts(later)
    assert 0 < len(nexts) <= count
    rank_of = {id(plan): i for i, (_, _, plan) in enumerate(ranked)}
    assert all(rank_of[id(p)] >= count for p in nexts)
    assert not {id(p) for p in nexts} & {id(p) for p in later}
    skipped = [plan for _, _, plan in ranked[count:rank_of[id(nexts[-1])]] if all(plan is not n for n in nexts)]
    assert all(any(plan is other for other in later) for plan in skipped)  # none passed over
    with_nexts = solve_with(problem, options, heuristic)
    with patch.object(Search, "next_starts", lambda self, later: []):
        without = solve_with(problem, options, heuristic)
    assert with_nexts.objective_s <= without.objective_s * (1 + 1e-12)


def test_the_progress_bars_cover_the_d_search_and_the_structure_moves():
    """Two bars, both full at the end: the D search (every D swept, its length set once the
    refinement's D are known) and the structure moves, counted in shapes priced against their
    work limit (the first starts' work, a start's share per other D's start, one for the family
    starts): a run of 20 s no longer sits at a frozen D-search bar while the moves work."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    problem = random_problem(4)  # 24 GPUs: every phase runs
    options, heuristic = SolverOptions(time_limit_s=30, threads=1), HeuristicOptions(move_evaluations=300)
    search = Search(problem, options, heuristic)
    with Progress(console=Console(file=io.StringIO()), auto_refresh=False) as progress:
        search.explore(progress)
        share = 300 // heuristic.polish_candidates
        expected = 300 + share * len(search.other_d_starts()) + (share if search.family_starts() else 0)
        search.own_best()
    d_bar, moves_bar = progress.tasks
    assert d_bar.description == "heuristic: D search" and moves_bar.description == "heuristic: structure moves"
    assert d_bar.finished and d_bar.total >= len({d for d, _, _ in search.found})
    assert moves_bar.finished and moves_bar.total == expected


def alike_pipelines(problem, pattern: list[tuple[int, int]], count: int):
    """`count` pipelines, each the stages (machine, TP size) of `pattern`, devices dealt in order."""
    from solvers.layered.heuristic.pipeline import StageSlot

    free = {m: list(problem.cluster.devices_of(m)) for m in range(len(problem.cluster.machines))}
    return tuple(tuple(StageSlot(machine=m, devices=tuple(free[m].pop(0) for _ in range(t))) for m, t in pattern)
                 for _ in range(count))


def test_reorders_change_the_machine_order_of_every_pipeline_at_once():
    """The heuristic's old hetero-2 7B structure (four alike pipelines, the A800 pair first; 10.738 s):
    every reorder keeps each pipeline's stages and gives all pipelines one machine order, and one
    of them (the 3090s first, the A800 next to last) assembles below 10.72 s unpolished."""
    from solvers.layered.heuristic.moves import _reorders_everywhere, assemble

    problem = load_problem("hetero2-llama2-7b")
    old = alike_pipelines(problem, [(5, 2), (4, 1), (4, 1), (3, 1), (3, 1), (1, 2), (0, 2), (2, 1), (2, 1)], 4)
    out = list(_reorders_everywhere(old))
    assert len(out) == 1 + 6 * 5  # reversed; each of 6 machine runs to each of the 5 places it is not at
    for cand in out:
        assert [Counter(pipe) for pipe in cand] == [Counter(pipe) for pipe in old]
        assert len({tuple(s.machine for s in pipe) for pipe in cand}) == 1
    assert tuple(pipe[::-1] for pipe in old) == out[0]
    best = min(iteration_time(problem, plan, check=False) for c in out if (plan := assemble(problem, c)))
    assert best < 10.72 < iteration_time(problem, assemble(problem, old), check=False)
