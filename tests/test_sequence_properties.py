"""Property tests of sequence plans on random clusters, models and plans.

Valid plans (built to satisfy every rule of docs/sequence-plans.md §7.1) validate and price to finite,
positive figures with 0 < MFU ≤ 1 (from §7.2: each replica needs at least its members'
linear, attention and head work over their summed π ≤ peak, with c ≥ 3 passes). Breaking one
rule of a valid plan is reported under that rule.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import Cluster, Link, Machine, ModelSpec, Problem, TrainingSpec
from planner.kinds import evaluate, iteration_time
from planner.sequence import validate
from planner.sequence import MemberTable, SeqPlan

NVIDIA = ["A100-80G", "H100", "RTX4090", "L40S", "H20"]
AMD = ["MI250X", "MI300X"]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw) -> Cluster:
    n = draw(st.integers(1, 4))
    machines = tuple(Machine(name=f"m{i}", gpu=draw(st.sampled_from(NVIDIA + AMD)),
                             count=draw(st.sampled_from([1, 2, 4, 8])), intra_bw_gbps=draw(st.floats(1, 900)))
                     for i in range(n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    links = tuple(Link(a=f"m{i}", b=f"m{j}", bw_gbps=draw(st.floats(0.5, 100)),
                       latency_us=draw(st.none() | st.floats(0, 100))) for i, j in chosen)
    return Cluster(machines=machines, links=links, inter_bw_gbps=draw(st.floats(0.5, 50)),
                   inter_latency_us=draw(st.floats(0, 100)), intra_latency_us=draw(st.floats(0, 20)))


@st.composite
def models(draw) -> ModelSpec:
    a = draw(st.sampled_from([2, 4, 8]))
    k = draw(st.sampled_from([x for x in (1, 2, 4, 8) if a % x == 0]))
    return ModelSpec(layers=draw(st.integers(1, 4)), hidden=a * draw(st.sampled_from([8, 16])), heads=a,
                     kv_heads=k, ffn_hidden=draw(st.integers(8, 256)), vocab=draw(st.integers(16, 1024)))


def _split(draw, total: int, parts: int) -> list[int]:
    """`total` as `parts` positive integers."""
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=parts - 1, max_size=parts - 1, unique=True))) \
        if parts > 1 else []
    return [hi - lo for lo, hi in zip([0, *cuts], [*cuts, total])]


def _vendor_runs(cluster: Cluster) -> list[list[int]]:
    """Devices cut where the vendor changes (a group never crosses a cut)."""
    runs: list[list[int]] = []
    last = None
    for m in range(len(cluster.machines)):
        vendor = cluster.gpu_of(m).vendor
        if vendor != last:
            runs.append([])
            last = vendor
        runs[-1] += cluster.devices_of(m)
    return runs


@st.composite
def valid_cases(draw):
    """(problem, [(batch, [[(device, heads, tokens), …] per group]) per replica])."""
    cluster, model = draw(clusters()), draw(models())
    q, b = draw(st.sampled_from([16, 32, 64])), draw(st.sampled_from([1, 2]))
    a, k = model.heads, model.num_kv_heads
    runs = _vendor_runs(cluster)
    groups = []  # device lists, each inside one vendor run, each of at most k devices
    for run in runs:
        i = 0
        while i < len(run) and draw(st.booleans() if groups else st.just(True)):
            n = draw(st.integers(1, min(k, len(run) - i)))
            groups.append(run[i:i + n])
            i += n
    assert groups
    replicas = draw(st.integers(1, len(groups)))
    ring_sizes = _split(draw, len(groups), replicas) if replicas > 1 else [len(groups)]
    units = max(math.ceil(len(g) / 2) for g in groups) * max(ring_sizes) + draw(st.integers(0, 4))
    out, start = [], 0
    for size in ring_sizes:
        ring = groups[start:start + size]
        start += size
        shares = _ring_units(draw, units, [math.ceil(len(g) / 2) for g in ring])
        out.append((b * draw(st.integers(1, 3)), [
            [(d, (a // k) * w, q * v) for d, w, v in zip(g, _split(draw, k, len(g)), _split(draw, 2 * u, len(g)))]
            for g, u in zip(ring, shares)]))
    training = TrainingSpec(seq_len=2 * q * units, global_batch=sum(r[0] for r in out), micro_batch=b,
                            token_block=q, recompute=draw(st.booleans()))
    return Problem(name="p", cluster=cluster, model=model, training=training), out


def _ring_units(draw, units: int, least: list[int]) -> list[int]:
    """`units` (of 2q tokens) over groups, group g getting at least least[g]."""
    extra = units - sum(least)
    split = _split(draw, extra + len(least), len(least))
    return [lo + s - 1 for lo, s in zip(least, split)]


def plan_of(spec) -> SeqPlan:
    return SeqPlan.from_rings(problem="p", batches=[r[0] for r in spec], rings=[r[1] for r in spec])


@SETTINGS
@given(valid_cases())
def test_valid_plans_validate_and_price_finitely(case):
    problem, spec = case
    plan = plan_of(spec)
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    assert math.isfinite(est.iteration_s) and est.iteration_s > 0
    assert 0 < est.mfu <= 1 + 1e-12 and math.isfinite(est.tokens_per_s)
    assert est.iteration_s == iteration_time(problem, plan)
    assert len(est.members) == len(plan.devices) and all(math.isfinite(m.memory_gib) for m in est.members)
    assert est.bottleneck.seconds <= est.iteration_s * (1 + 1e-12)


def _members(spec):
    return [(r, g, i) for r, (_, ring) in enumerate(spec) for g, grp in enumerate(ring) for i in range(len(grp))]


def _set(spec, where, **change):
    r, g, i = where
    out = [(b, [list(grp) for grp in ring]) for b, ring in spec]
    d, h, t = out[r][1][g][i]
    out[r][1][g][i] = (change.get("device", d), change.get("heads", h), change.get("tokens", t))
    return out


BREAKS = ["device", "unknown_device", "heads", "tokens", "shards", "batch", "memory"]


def _break(draw, problem: Problem, spec, rule: str):
    """A copy of (problem, spec) with one rule broken; the rule the validator must name."""
    where = draw(st.sampled_from(_members(spec)))
    r, g, i = where
    d, h, t = spec[r][1][g][i]
    q = problem.training.token_block
    if rule in ("device", "unknown_device"):
        others = [spec[r2][1][g2][i2][0] for r2, g2, i2 in _members(spec) if (r2, g2) != (r, g)]
        new = problem.cluster.num_devices + 3 if rule == "unknown_device" or not others else draw(st.sampled_from(others))
        return problem, _set(spec, where, device=new), "device"
    if rule == "heads":
        return problem, _set(spec, where, heads=h + 1), "heads"
    if rule == "tokens":
        return problem, _set(spec, where, tokens=t + q // 2), "tokens"
    if rule == "shards":
        return problem, _set(spec, where, tokens=t + q), "shards"
    if rule == "batch":
        out = [(b + (problem.training.micro_batch if j == r else 0), ring) for j, (b, ring) in enumerate(spec)]
        return problem, out, "batch"
    training = problem.training.model_copy(update={"reserved_gib": 10_000})
    return problem.model_copy(update={"training": training}), spec, "memory"


@SETTINGS
@given(valid_cases(), st.sampled_from(BREAKS), st.data())
def test_each_broken_rule_is_reported(case, rule, data):
    problem, spec = case
    problem, spec, expected = _break(data.draw, problem, spec, rule)
    rules = {v.rule for v in validate(problem, plan_of(spec))}
    assert expected in rules, (rule, rules)


def test_arrays_from_a_solver_are_checked_too():
    """A `MemberTable` built from a solver's arrays: zero heads and a negative device id are
    reported, never priced or indexed from the end."""
    cluster = Cluster(inter_bw_gbps=10, machines=(Machine(name="n", gpu="H100", count=2, intra_bw_gbps=100),))
    model = ModelSpec(layers=1, hidden=32, heads=2, kv_heads=2, ffn_hidden=32, vocab=64)
    problem = Problem(cluster=cluster, model=model, training=TrainingSpec(seq_len=256, global_batch=1))
    table = MemberTable.from_arrays([-1, 1], [0, 2], [128, 128], [2], [1], [1])
    messages = [str(v) for v in validate(problem, table)]
    assert any("[device]" in m and "devices [-1] do not exist" in m for m in messages)
    assert any("[heads]" in m and "heads 0 is not a positive multiple" in m for m in messages)


def test_a_group_mixing_vendors_is_reported():
    cluster = Cluster(inter_bw_gbps=10, machines=(Machine(name="n", gpu="H100", count=1, intra_bw_gbps=100),
                                                  Machine(name="r", gpu="MI300X", count=1, intra_bw_gbps=100)))
    model = ModelSpec(layers=1, hidden=32, heads=2, kv_heads=2, ffn_hidden=32, vocab=64)
    problem = Problem(cluster=cluster, model=model, training=TrainingSpec(seq_len=256, global_batch=1))
    plan = SeqPlan.from_rings(problem="p", batches=[1], rings=[[[(0, 1, 128), (1, 1, 128)]]])
    (v,) = validate(problem, plan)
    assert v.rule == "vendor" and "nvidia devices [0]" in v.message and "amd devices [1]" in v.message


@SETTINGS
@given(clusters(), st.data())
def test_within_sets_block_and_pairs_agree(cluster, data):
    """The two ways of taking each set's smallest bandwidth and largest latency agree."""
    import numpy as np

    from planner.sequence.links import Units, within_sets_by_block, within_sets_by_pairs

    n = cluster.num_devices
    num_sets = data.draw(st.integers(1, n))
    set_of = np.array(sorted(data.draw(st.lists(st.integers(0, num_sets - 1), min_size=n, max_size=n))
                             + list(range(num_sets)))[:n])
    set_of = np.searchsorted(np.unique(set_of), set_of)  # sets 0..k-1, none empty
    units = Units.of(len(cluster.machines), set_of, cluster.machine_of_device, int(set_of.max()) + 1)
    block, pairs = within_sets_by_block(cluster, units), within_sets_by_pairs(cluster, units)
    assert np.array_equal(block[0], pairs[0]) and np.array_equal(block[1], pairs[1])
