"""Property tests of the evaluator and the validator on random clusters and random plans.

Valid plans (built to satisfy every rule of docs/plan-space.md §2) must validate and price to finite,
positive figures with 0 < MFU ≤ 1 (a bound that follows from §3: every pipeline needs at least
m_p·max C_k, and C uses c ≥ 3 passes at π ≤ peak). Each kind of invalid plan, made by breaking
one rule of a valid plan, must be reported under that rule.
"""

from __future__ import annotations

import math

import numpy as np

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.layered import holders
from planner import Cluster, Link, Machine, ModelSpec, Plan, Problem, TrainingSpec, evaluate, validate
from planner.layered.pricing import iteration_time

GPU_TYPES = ["A100-80G", "H100", "RTX4090", "RTX3090", "L40S", "MI300X", "H20"]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw, min_machines: int = 1) -> Cluster:
    n = draw(st.integers(min_machines, 4))
    machines = tuple(
        Machine(name=f"m{i}", gpu=draw(st.sampled_from(GPU_TYPES)),
                count=draw(st.sampled_from([1, 2, 4, 8])),
                intra_bw_gbps=draw(st.floats(1, 900)))
        for i in range(n)
    )
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    links = tuple(Link(a=f"m{i}", b=f"m{j}", bw_gbps=draw(st.floats(0.5, 100)),
                       latency_us=draw(st.none() | st.floats(0, 100))) for i, j in chosen)
    return Cluster(machines=machines, links=links, inter_bw_gbps=draw(st.floats(0.5, 50)),
                   inter_latency_us=draw(st.floats(0, 100)), intra_latency_us=draw(st.floats(0, 20)))


@st.composite
def models(draw) -> ModelSpec:
    heads = draw(st.sampled_from([2, 4, 8]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0]))
    return ModelSpec(layers=draw(st.integers(1, 12)), hidden=heads * draw(st.sampled_from([8, 16])),
                     heads=heads, kv_heads=kv, ffn_hidden=draw(st.integers(16, 256)),
                     vocab=draw(st.integers(16, 1000)), gated=draw(st.booleans()))


def tp_groups(draw, cluster: Cluster, model: ModelSpec) -> list[list[int]]:
    """Split each machine's devices into groups of allowed TP sizes (some devices left idle)."""
    groups = []
    for m in range(len(cluster.machines)):
        free = cluster.devices_of(m)
        while free and draw(st.integers(0, 4)) > 0:
            t = draw(st.sampled_from(model.tp_sizes(len(free))))
            groups.append(free[:t])
            free = free[t:]
    return groups


@st.composite
def problems_and_plans(draw, min_machines: int = 1):
    """A problem (tiny model, ample memory) and a valid plan for it."""
    cluster, model = draw(clusters(min_machines)), draw(models())
    groups = draw(st.permutations(tp_groups(draw, cluster, model)))
    assume(groups)
    pipelines = draw(st.integers(1, len(groups)))
    stages_of = [groups[p::pipelines][: model.layers] for p in range(pipelines)]
    micro = draw(st.sampled_from([1, 2]))
    spec = []
    for stage_groups in stages_of:
        cuts = [] if len(stage_groups) == 1 else sorted(draw(st.lists(
            st.integers(1, model.layers - 1), unique=True,
            min_size=len(stage_groups) - 1, max_size=len(stage_groups) - 1)))
        layers = [b - a for a, b in zip([0, *cuts], [*cuts, model.layers])]
        batch = micro * draw(st.integers(1, 4))
        spec.append({"batch": batch, "stages": [{"devices": g, "layers": n}
                                                for g, n in zip(stage_groups, layers)]})
    training = TrainingSpec(seq_len=draw(st.sampled_from([16, 64, 256])), micro_batch=micro,
                            global_batch=sum(p["batch"] for p in spec), recompute=draw(st.booleans()))
    return Problem(cluster=cluster, model=model, training=training), Plan.model_validate({"pipelines": spec})


def rules(problem: Problem, plan_data: dict) -> set[str]:
    return {v.rule for v in validate(problem, Plan.model_validate(plan_data))}


@SETTINGS
@given(problems_and_plans())
def test_valid_plans_price_to_finite_positive_figures(case):
    problem, plan = case
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    assert math.isfinite(est.iteration_s) and est.iteration_s > 0
    assert est.iteration_s >= max(p.time_s for p in est.pipelines)
    assert est.iteration_s == est.pipe_s + est.dp_s
    assert 0 < est.mfu <= 1 + 1e-12
    assert est.tokens_per_s > 0 and math.isfinite(est.tokens_per_s)
    for s in est.stages:
        assert s.compute_s > 0 and s.tau_s >= s.compute_s and s.pp_s >= 0 and s.dp_s >= 0
        assert 0 < s.memory_gib < s.capacity_gib and math.isfinite(s.memory_gib)
    assert (est.dp_s == 0) == (len(plan.pipelines) == 1)
    assert iteration_time(problem, plan) == est.iteration_s


@SETTINGS
@given(problems_and_plans(), st.data())
def test_each_broken_rule_is_reported(case, data):
    problem, plan = case
    base = plan.model_dump(mode="json", exclude_none=True)
    stages = [(p, k) for p, pipe in enumerate(plan.pipelines) for k in range(len(pipe.stages))]
    p, k = data.draw(st.sampled_from(stages))

    def with_stage(devices=None, layers=None, batch=None) -> dict:
        out = plan.model_dump(mode="json", exclude_none=True)
        stage = out["pipelines"][p]["stages"][k]
        stage["devices"] = stage["devices"] if devices is None else devices
        stage["layers"] = stage["layers"] if layers is None else layers
        out["pipelines"][p]["batch"] = out["pipelines"][p]["batch"] if batch is None else batch
        return out

    n = problem.cluster.num_devices
    assert rules(problem, base) == set()
    assert "device" in rules(problem, with_stage(devices=[n + data.draw(st.integers(0, 5))]))
    assert rules(problem, with_stage(layers=plan.pipelines[p].stages[k].layers + 1)) == {"layers"}
    over = problem.model_copy(update={"training": problem.training.model_copy(update={"reserved_gib": 1e4})})
    assert "memory" in rules(over, base)
    if len(stages) > 1:  # give this stage the devices of another stage
        q, j = data.draw(st.sampled_from([s for s in stages if s != (p, k)]))
        assert "device" in rules(problem, with_stage(devices=list(plan.pipelines[q].stages[j].devices)))
    if problem.training.micro_batch > 1:
        assert "batch" in rules(problem, with_stage(batch=plan.pipelines[p].batch + 1))
    big = [m for m in range(len(problem.cluster.machines)) if problem.cluster.machines[m].count >= 3]
    if big:  # three devices of one machine: not a power of two
        assert "tp_size" in rules(problem, with_stage(devices=problem.cluster.devices_of(big[0])[:3]))


@SETTINGS
@given(problems_and_plans(min_machines=2), st.data())
def test_a_stage_across_machines_is_reported(case, data):
    problem, plan = case
    cluster = problem.cluster
    m0, m1 = sorted(data.draw(st.lists(st.integers(0, len(cluster.machines) - 1), min_size=2,
                                       max_size=2, unique=True)))
    devices = [cluster.devices_of(m0)[0], cluster.devices_of(m1)[0]]
    assume(all(t % 2 == 0 for t in (problem.model.heads, problem.model.num_kv_heads)))
    broken = plan.model_dump(mode="json", exclude_none=True)
    broken["pipelines"][0]["stages"][0]["devices"] = devices
    assert "machine" in rules(problem, broken)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(2, 40), st.integers(1, 9), st.integers(0, 2**31),
       st.sampled_from([(1 << 13, 1 << 22), (1, 1 << 22), (1 << 13, 1)]))
def test_vectorized_dp_pairs_match_the_per_layer_reading(n, d, rows, seed, limits):
    """holders_bw_lat_rows (all layers at once, in blocks or row by row) == holders_bw_lat."""
    rng = np.random.default_rng(seed)
    bw, lat = rng.random((n, n)) * 100, rng.random((n, n)) * 1e-4  # not even symmetric
    machines = rng.integers(0, n, (rows, d))
    got_bw, got_lat = holders.holders_bw_lat_rows(machines, bw, lat, *limits)
    for r in range(rows):
        assert (got_bw[r], got_lat[r]) == holders.holders_bw_lat(machines[r], bw, lat)
