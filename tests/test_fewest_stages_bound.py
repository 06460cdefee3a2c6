"""[U16] the fewest stages of any pipeline (docs/bounds.md §6, `fewest_stages.py`): the premise
against the evaluator on brute force's plans, the tables of pipelines of s stages or more against
an enumeration of relaxed pipelines, the cases' tables against the tables they split, and a
threshold only the split refutes. The bound of the whole search against brute force's optimum
(which runs every case) is in test_config_bound.py."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import numpy as np

from instances.generate import generate_cluster, generated_problem
from planner.base import GIB
from planner.hardware import Cluster, GpuType, Machine
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec
from instances.random_small import random_small
from solvers.layered.bound import integer, route, search
from solvers.layered.bound.classes import class_types
from solvers.layered.bound.fewest_stages import FEWEST_SPLIT, FewestStagesCases, single_stage_floors, with_fewest_stages
from solvers.layered.bound.narrowest import case_widths
from solvers.layered.bound.pricing import breakpoints, layer_limits, stage_contribution
from solvers.layered.bound.usage import TABLE_SLACK, hop_floor, usage_tables, widest_stage_sync
from solvers.layered.tables import Tables
from tests.test_narrowest_bound import brute_plans_by_d, type_index


def test_t_dp_is_at_least_every_pipelines_summed_floors_over_the_fewest_stages() -> None:
    """Every plan brute force lists (the first 2,000 per problem) on 40 tiny and 20 small problems
    with D ≥ 2 pipelines, s the fewest stages of any: the evaluator's T_dp (its largest stage sync)
    is at least G_p/s for every pipeline p, G_p = Σ over p's stages of n·sync_layer (+ sync_head on
    its last), their class-level types at D. G_p/s is more than p's largest stage floor (what [U4]
    alone gives) on many of them."""
    checked = stronger = 0
    problems = [random_small(seed, tiny=True) for seed in range(40)] + [random_small(seed) for seed in range(20)]
    for problem, pipes, types, pipelines in brute_plans_by_d(problems, 2000):
        t_dp = max(stage[3] for stages in pipelines for stage in stages)
        fewest = min(len(stages) for stages in pipelines)
        for stages in pipelines:
            floors = [_floor(types, machine, t, n, last) for machine, t, n, _, last in stages]
            assert t_dp >= sum(floors) / fewest * (1 - 1e-9), (problem.name, pipes)
            checked += 1
            stronger += sum(floors) / fewest > max(floors) * (1 + 1e-6)
    assert checked >= 2000 and stronger >= 200, (checked, stronger)


def _floor(types, machine: int, t: int, n: int, last: bool) -> float:
    """[U4]'s floor of a stage of n layers on `machine` at width t (its class-level type's)."""
    i = type_index(types, machine, t)
    return n * types.sync_layer[i] + (types.sync_head[i] if last else 0.0)


def test_tables_of_pipelines_of_s_stages_or_more_are_the_least_over_an_enumeration() -> None:
    """On 12 tiny problems (2–6 layers), every relaxed pipeline enumerated stage by stage (type and
    layers of each, within each role's limits at b): per breakpoint and usage the least bubble over
    those of ≥ s stages is the bare table of `with_fewest_stages(types, s)`, for s = 1, 2, 3; with
    case s's shares (every stage's floor times 1/s) the own table is the larger of that least and
    the bare least plus the floor of the stage that sets b ([U4]) — not the bare table built on the
    prefix that carries the shares, which counted a stage's floor twice (seed 77 of the tiny set
    then had a bound above brute force's optimum)."""
    compared = 0
    for seed in range(12):
        tables = Tables(random_small(seed, tiny=True))
        base = class_types(tables, min(2, tables.max_pipelines))
        b = breakpoints(base, 2 * tables.trivial_bound)[::3]
        d, hops = base.pipelines, hop_floor(base).ravel()[None, :]
        for s in (1, 2, 3):
            plain, shared = with_fewest_stages(base, s), with_fewest_stages(base, s, 1 / s)
            bare = usage_tables({d: plain}, b, own=set())[d].least / (1 - TABLE_SLACK) - hops
            enumerated_bare = _enumerated(replace_sync(plain), b, s)
            own = usage_tables({d: shared}, b, crossing=False)[d].least / (1 - TABLE_SLACK) - hops
            want = _enumerated(shared, b, s)
            if d >= 2:
                want = np.maximum(want, enumerated_bare + widest_stage_sync(shared, b)[:, None])
            for got, expected in ((bare, enumerated_bare), (own, want)):
                finite = np.isfinite(expected)
                assert (np.isfinite(got) == finite).all(), (seed, s)
                np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, err_msg=f"seed {seed} s {s}")
                compared += int(finite.sum())
    assert compared >= 800, compared


def replace_sync(types):
    """`types` without sync floors (what a bare table prices)."""
    return replace(types, sync_layer=np.zeros_like(types.sync_layer), sync_head=np.zeros_like(types.sync_head))


def _enumerated(types, b: np.ndarray, fewest: int, wide_from: int = 0) -> np.ndarray:
    """[K, U]: the least Σ stage_contribution over relaxed pipelines of ≥ `fewest` stages by usage
    (with `wide_from`: only those with a stage of at least that many devices)."""
    dims = tuple(int(n) + 1 for n in types.devices)
    out = np.full((len(b), int(np.prod(dims))), np.inf)
    limits = {role: layer_limits(types, b, role) for role in ("first", "middle", "last", "single")}
    contrib = {role: stage_contribution(types, role) for role in limits}
    big_l = types.layers
    for m in range(max(1, fewest), big_l + 1):
        roles = ["single"] if m == 1 else ["first"] + ["middle"] * (m - 2) + ["last"]
        for split in _compositions(big_l, m):
            for kinds in itertools.product(range(types.num_types), repeat=m):
                if max(types.tp[i] for i in kinds) < wide_from:
                    continue
                usage = np.zeros(len(dims), dtype=int)
                for i in kinds:
                    usage[types.cls[i]] += types.tp[i]
                if (usage >= np.array(dims)).any():
                    continue
                ok = np.all([n <= limits[r][:, i] for r, i, n in zip(roles, kinds, split)], axis=0)
                value = sum(contrib[r][i, n] for r, i, n in zip(roles, kinds, split))
                cell = int(np.ravel_multi_index(tuple(usage), dims))
                out[ok, cell] = np.minimum(out[ok, cell], value)
    return out


def _compositions(total: int, parts: int):
    """Every way to write `total` as `parts` positive integers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *cuts, total)
        yield tuple(hi - lo for lo, hi in zip(edges, edges[1:]))


def test_each_cases_table_is_above_the_unsplit_one_and_the_shared_ones_below_the_own() -> None:
    """On small problems, D ≥ 2: case s's own table (pipelines of ≥ s stages, every floor times
    1/s) is at least the unsplit own table of pipelines of ≥ s stages for s = 1 (above it
    somewhere: the shares of the other stages), and the table shared by D's range is below D's own;
    the rest's table is the unsplit own table of pipelines of ≥ FEWEST_SPLIT + 1 stages."""
    raised = 0
    for seed in range(12):
        tables = Tables(random_small(seed))
        if tables.max_pipelines < 2:
            continue
        b = breakpoints(class_types(tables, 1), 3 * tables.trivial_bound)
        ds = list(range(1, tables.max_pipelines + 1))
        by_d = {e: class_types(tables, e) for e in ds}
        cases, fresh = (FewestStagesCases(tables, False, b, by_d, set(ds), True) for _ in range(2))
        d = ds[-1]
        one = usage_tables({d: class_types(tables, d)}, b)[d]
        own = cases.table(d, 1, float("inf"))
        assert (own.least >= one.least).all() and (own.crossing >= one.crossing).all(), seed
        raised += bool((own.least > one.least * (1 + 1e-6)).any())
        for s in range(1, FEWEST_SPLIT + 1):
            assert (fresh.table(d, s, None).least <= cases.table(d, s, float("inf")).least).all(), (seed, s)
        rest = usage_tables({d: with_fewest_stages(class_types(tables, d), FEWEST_SPLIT + 1)}, b)[d]
        np.testing.assert_array_equal(cases.table(d, FEWEST_SPLIT + 1, None).least, rest.least)
    assert raised >= 3, raised


def test_on_gen24_seed2_d3_the_split_refutes_what_the_unsplit_table_does_not() -> None:
    """Generated 24 GPUs (A100-80G, RTX4090, H20 machines of 8), seed 2, D = 3: the unsplit own
    table refutes up to 5.8325 s (its relaxed plan has pipelines of one stage on four A100s, priced
    with their own sync only), while case 1 refutes up to 5.904 s, case 2 5.893 s (5.818 s with the
    shares alone: the last stage's floor matters) and the rest 6.062 s (bisected, integer test
    alone), so at 5.86 s only the split refutes."""
    problem = generated_problem(generate_cluster(24, "A100-80G:1,RTX4090:1,H20:1", 2), "llama2-13b")
    tables, d, v = Tables(problem), 3, 5.86
    _, b, _, _, by_gpu = route._route_classes(tables, [d], 6.0, np.inf, {d})
    types, micro = class_types(tables, d, by_gpu), tables.total_micro
    assert not integer.refuted(usage_tables({d: types}, b)[d], d, micro, v)
    cases = FewestStagesCases(tables, by_gpu, b, {e: class_types(tables, e, by_gpu) for e in (1, 2, 3)}, {3}, True)
    for s in cases.cases():
        assert integer.refuted(cases.table(d, s, np.inf), d, micro, v), s


def test_deepened_wide_tables_are_the_least_over_an_enumeration() -> None:
    """[U14]'s split with pipelines of ≥ s stages (the rest's tables in the refinement): on 12 tiny
    problems the bare table of pipelines of ≥ s stages with a stage of t ≥ w (`_deepened` wide
    prefixes) is the least over the enumerated relaxed pipelines that have one, for s = 2, 3."""
    compared = 0
    for seed in range(12):
        tables = Tables(random_small(seed, tiny=True))
        base = class_types(tables, min(2, tables.max_pipelines))
        b = breakpoints(base, 2 * tables.trivial_bound)[::3]
        hops = hop_floor(base).ravel()[None, :]
        for s, w in itertools.product((2, 3), case_widths(base)[1:]):
            types = with_fewest_stages(base, s)
            got = usage_tables({types.pipelines: types}, b, own=set(), wide_from=w)[types.pipelines].least
            got = got / (1 - TABLE_SLACK) - hops
            want = _enumerated(replace_sync(types), b, s, wide_from=w)
            finite = np.isfinite(want)
            assert (np.isfinite(got) == finite).all(), (seed, s, w)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, err_msg=f"seed {seed} s {s} w {w}")
            compared += int(finite.sum())
    assert compared >= 100, compared


def test_the_cases_run_only_where_their_first_tables_fit_half_the_time_left() -> None:
    """`FewestStagesCases.affordable`: with an estimated prefix time that leaves no room (gen-40
    seed 0: about 70 s a prefix, nine of them, in 600 s) the test of a D is the route's alone;
    with room, the cases join it; once their first tables are built, they stay."""
    tables = Tables(random_small(3))
    ds = list(range(1, tables.max_pipelines + 1))
    built = route._usage_route(tables, ds, 3 * tables.trivial_bound, float("inf"), lambda line: None, None)
    d = ds[-1]
    built.fewest.prefix_s, built.fewest.deadline = 10.0, time.perf_counter() + 100.0  # 90 s > 50 s
    assert not isinstance(search._test(tables, built, d).split, search._CaseSplits)
    built.fewest.prefix_s = 1.0  # 9 s ≤ 50 s
    assert isinstance(search._test(tables, built, d).split, search._CaseSplits)
    built.fewest.shared[1, (d, d)] = built.used[d]  # (any table: "built")
    built.fewest.prefix_s = 10.0
    assert isinstance(search._test(tables, built, d).split, search._CaseSplits)


def test_a_one_stage_pipeline_syncs_at_least_its_layers_that_cannot_stay_local() -> None:
    """[U17] on the plans brute force lists with D ≥ 2 pipelines, one of them a single stage: the
    evaluator's T_dp is at least `single_stage_floors` of that stage's class-level type. On 10 tiny
    and 10 small random problems (their first 1,000 plans) the memory or the machine sizes already
    decide, and the floor is [U16]'s G_p/1; on machines of 5 and 3 like devices that hold 1–2 of 4
    layers each, a stage of 4 devices leaves the other pipelines too few devices beside it for all
    its layers to sync inside its machine: the floor is above G_p/1 there, and with every layer
    taken as crossing it fails."""
    random_problems = [random_small(seed, tiny=True) for seed in range(10)] + [random_small(seed) for seed in range(10)]
    checked, _ = _one_stage_floors_hold(random_problems, 1000)
    assert checked >= 500, checked
    checked, stronger = _one_stage_floors_hold([_memory_tight(share) for share in (1.3, 2.2)], 12000)
    assert checked >= 1500 and stronger >= 900, (checked, stronger)


def _one_stage_floors_hold(problems, plans: int) -> tuple[int, int]:
    """(plans × one-stage pipelines checked, those where the floor is above G_p/1)."""
    checked = stronger = 0
    for problem, pipes, types, pipelines in brute_plans_by_d(problems, plans):
        if min(len(stages) for stages in pipelines) > 1:
            continue
        floors, t_dp = single_stage_floors(types), max(stage[3] for stages in pipelines for stage in stages)
        for (machine, t, n, _, _), in (stages for stages in pipelines if len(stages) == 1):
            i = type_index(types, machine, t)
            assert t_dp >= floors[i] * (1 - 1e-9), (problem.name, pipes, t_dp, floors[i])
            checked += 1
            stronger += floors[i] > _floor(types, machine, t, n, True) * (1 + 1e-6)
    return checked, stronger


def _memory_tight(share: float) -> Problem:
    """4 layers on machines of 5 and 3 like devices, each with `share` × one layer's model states."""
    model = ModelSpec(name="four", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=1000, gated=True)
    gpu = GpuType(name="G", peak_tflops=100.0, memory_gib=share * 16 * model.total_params / model.layers / GIB,
                  efficiency=0.5)
    machines = tuple(Machine(name=name, gpu="G", count=count, intra_bw_gbps=300.0, intra_latency_us=5.0)
                     for name, count in (("a", 5), ("b", 3)))
    return Problem(name=f"memory-tight-{share}", model=model,
                   cluster=Cluster(name="five-three", machines=machines, inter_bw_gbps=1.25, inter_latency_us=30.0,
                                   gpu_types=(gpu,)),
                   training=TrainingSpec(seq_len=512, micro_batch=1, global_batch=4, recompute=True, reserved_gib=0.0))
