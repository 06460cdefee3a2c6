"""Mixed-vendor clusters in the planner (docs/vendors.md §8): the bridge in every reading of the
links, hand-checked T of a tiny mixed layered plan and a tiny mixed sequence plan (every
expected number is plain arithmetic from docs/cost-model.md and docs/vendors.md, written in the comments), the exact
solvers against brute force on mixed instances, and the vendor rules' messages."""

from __future__ import annotations

import numpy as np
import pytest

from planner import Cluster, GpuType, Machine, ModelSpec, Plan, Problem, TrainingSpec
from planner.base import US
from planner.kinds import evaluate, iteration_time, validate
from planner.layered.bridge import layered_bridge_traffic
from planner.sequence.bridge import sequence_bridge_traffic
from planner.sequence import SeqPlan
from solvers.common import SolverOptions
from solvers.layered.exact import brute, cpsat, milp
from test_planner_scale import random_cluster, reference_matrices

REL = 1e-9
NV = GpuType(name="NV", vendor="nvidia", peak_tflops=100, memory_gib=16, efficiency=0.5)
AM = GpuType(name="AM", vendor="amd", peak_tflops=100, memory_gib=16, efficiency=0.5)
OT = GpuType(name="OT", vendor="other", peak_tflops=100, memory_gib=16, efficiency=0.5)


def close(actual: float, expected: float) -> bool:
    return actual == pytest.approx(expected, rel=REL, abs=0)


def with_vendors(cluster: Cluster, rng: np.random.Generator) -> Cluster:
    """`cluster` with each machine's GPU drawn from NV / AM / OT and a random bridge."""
    machines = [m.model_copy(update={"gpu": str(rng.choice(["NV", "AM", "OT"]))}) for m in cluster.machines]
    return Cluster.model_validate({**cluster.model_dump(), "machines": [m.model_dump() for m in machines],
                                   "gpu_types": [NV.model_dump(), AM.model_dump(), OT.model_dump()],
                                   "cross_vendor_bw_gbps": float(rng.choice([0.3, 2.0, 100.0])),
                                   "cross_vendor_latency_us": float(rng.choice([0.0, 50.0]))})


@pytest.mark.parametrize("seed", range(8))
def test_every_link_reading_is_bridged(seed):
    """Dense matrices, pair lookups and row extremes all give §8's figures: between an nvidia
    and an amd machine min(§1 bw, bridge) and §1 latency + bridge latency; `other` unbridged."""
    rng = np.random.default_rng(700 + seed)
    cluster = with_vendors(random_cluster(rng, int(rng.integers(2, 20))), rng)
    bw, lat = reference_matrices(cluster)
    vendor = np.array([cluster.gpu_of(i).vendor.value for i in range(len(cluster.machines))])
    cross = ((vendor[:, None] == "nvidia") & (vendor[None, :] == "amd")) | \
            ((vendor[:, None] == "amd") & (vendor[None, :] == "nvidia"))
    bw = np.where(cross, np.minimum(bw, cluster.cross_vendor_bw_gbps), bw)
    lat = np.where(cross, lat + cluster.cross_vendor_latency_us * US, lat)
    assert np.array_equal(cluster.bw_matrix, bw) and np.array_equal(cluster.lat_matrix, lat)
    n = len(cluster.machines)
    mi, mj = rng.integers(0, n, (2, 300))
    assert np.array_equal(cluster.bw_table(mi, mj), bw[mi, mj])
    assert np.array_equal(cluster.lat_table(mi, mj), lat[mi, mj])
    for _ in range(20):
        row = rng.integers(0, n, int(rng.integers(2, 12)))
        pairs = [(a, b) for i, a in enumerate(row) for j, b in enumerate(row) if i != j]
        assert cluster.bw_table.row_extremes(row, use_max=False) == min(bw[a, b] for a, b in pairs)
        assert cluster.lat_table.row_extremes(row, use_max=True) == max(lat[a, b] for a, b in pairs)


def test_other_is_never_bridged_and_bad_bridges_are_refused():
    machines = (Machine(name="n", gpu="NV", count=1, intra_bw_gbps=100),
                Machine(name="o", gpu="OT", count=1, intra_bw_gbps=100))
    cluster = Cluster(machines=machines, inter_bw_gbps=50, gpu_types=(NV, OT), cross_vendor_bw_gbps=1)
    assert not cluster.mixes_vendors and cluster.bw(0, 1) == 50 and cluster.lat(0, 1) == 30 * US
    for bad in ({"cross_vendor_bw_gbps": -1}, {"cross_vendor_bw_gbps": float("inf")},
                {"cross_vendor_latency_us": -5}):
        with pytest.raises(ValueError):
            Cluster(machines=machines, inter_bw_gbps=50, gpu_types=(NV, OT), **bad)


# Four one-device machines n0 (NV), a0 (AM), n1 (NV), a1 (AM): π = 100·0.5 = 50e12 FLOP/s each;
# 100 GB/s and 30 µs between machines; bridge 10 GB/s and 50 µs, so between vendors
# bw = min(100, 10) = 10 GB/s and lat = 30 + 50 = 80 µs.
MIXED4 = Cluster(name="mixed4", gpu_types=(NV, AM), inter_bw_gbps=100, inter_latency_us=30,
                 cross_vendor_bw_gbps=10, cross_vendor_latency_us=50,
                 machines=tuple(Machine(name=n, gpu=g, count=1, intra_bw_gbps=100)
                                for n, g in [("n0", "NV"), ("a0", "AM"), ("n1", "NV"), ("a1", "AM")]))
# Model M of tests/test_planner_handcheck.py: L=4, h=64, a=k=4, f=128, V=256, gated; s = 128:
#   P_layer = 41088, P_emb = 16384, P_head = 16448, F_layer = 114688, F_head = 32768
MODEL_M = ModelSpec(name="m", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=128, vocab=256)


def test_hand_checked_mixed_layered_plan():
    """Pipeline 0: n0 → a0, pipeline 1: a1 → n1 (2 layers a stage, B_p = 2, m = 2): both
    pipelines cross the bridge, and every layer's DP pair (n0, a1) or (a0, n1) crosses it."""
    problem = Problem(cluster=MIXED4, model=MODEL_M, training=TrainingSpec(seq_len=128, global_batch=4))
    plan = Plan.model_validate({"pipelines": [
        {"batch": 2, "stages": [{"devices": [0], "layers": 2}, {"devices": [1], "layers": 2}]},
        {"batch": 2, "stages": [{"devices": [3], "layers": 2}, {"devices": [2], "layers": 2}]}]})
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    # F_layer = 2·P_mm + 2h(s+1) = 81920 + 16512 = 98432 (causal attention, η_att = η)
    # C_0 = c·b·s·(2·F_layer)/π = 4·128·196864/50e12 ; C_1 = 4·128·(196864 + 32768)/50e12 ; no TP
    c0, c1 = 512 * 196864 / 50e12, 512 * 229632 / 50e12
    # T_pp,0 = 2·(A/(10 GB/s) + 80 µs), A = b·s·h·β = 16384 bytes (the bridged pair)
    pp0 = 2 * (16384 / 10e9 + 80e-6)
    # 1F1B: Σ τ + T_pp + (m − 1)·max(τ0, T_pp0, τ1), T_pp0 the largest
    t_pipe = c0 + c1 + pp0 + pp0
    # T_dp: D = 2, holders across the bridge: τ_dp = 2·(1/2)·P·γ/1e10 + 2·80 µs = 2P/1e10 + 160 µs;
    # first stages: emb + 2 layers = 16384 + 82176 ; last stages: 82176 + 16448 (the larger)
    t_dp = 2 * (82176 + 16448) / 10e9 + 3 * 160e-6
    for p in est.pipelines:
        assert close(p.stages[0].compute_s, c0) and close(p.stages[1].compute_s, c1)
        assert close(p.stages[0].pp_s, pp0) and close(p.time_s, t_pipe)
    assert close(est.dp_s, t_dp) and close(est.iteration_s, t_pipe + t_dp)
    assert close(iteration_time(problem, plan), t_pipe + t_dp)
    # over the bridge: each pipeline's boundary carries 2·A a micro-batch, m = 2: 2·(2·16384·2);
    # every unit's two holders span V = 2 vendors: V·(V−1)·P·γ = 4·P over
    # P_total = 4·41088 + 16384 + 16448 = 197184
    traffic = layered_bridge_traffic(problem, plan)
    assert traffic.bytes_by_kind == {"pp": 2 * 2 * 16384 * 2, "dp": 4 * 197184}
    # bridge-bound seconds: the slowest pipeline's fill/drain T_pp and its steady term (both the
    # crossing T_pp0), and all of T_dp (every layer's holders cross)
    assert close(traffic.bridge_s, 2 * pp0 + t_dp) and close(traffic.iteration_s, t_pipe + t_dp)


# Sequence: the cluster of tests/test_sequence_handcheck.py with vendors: m0 = 2×G100 (nvidia,
# π = 50e12, 100 GB/s, 5 µs: devices 0, 1), m1 = 1×G50 (amd, π = 20e12: device 2); 10 GB/s and
# 30 µs between them; bridge 4 GB/s and 50 µs → m0–m1: min(10, 4) = 4 GB/s, 30 + 50 = 80 µs.
G100 = GpuType(name="G100", vendor="nvidia", peak_tflops=100, memory_gib=16, efficiency=0.5)
G50 = GpuType(name="G50", vendor="amd", peak_tflops=40, memory_gib=8, efficiency=0.5)
SEQ_CLUSTER = Cluster(
    name="hand", gpu_types=(G100, G50), inter_bw_gbps=10, inter_latency_us=30, intra_latency_us=5,
    cross_vendor_bw_gbps=4, cross_vendor_latency_us=50,
    machines=(Machine(name="m0", gpu="G100", count=2, intra_bw_gbps=100),
              Machine(name="m1", gpu="G50", count=1, intra_bw_gbps=10)))
# GQA model: L=2, h=64, a=4, k=2 (d=16), f=128, V=256: P_layer = 36992, P_layer − 2h = 36864,
#   P_emb + P_head = 32832
GQA = ModelSpec(name="gqa", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=256)


def test_hand_checked_mixed_sequence_plan():
    """Ring g0 = device 0 (256 tokens), g1 = device 1 (128), g2 = device 2 on the amd machine
    (128); s = 512, B = 2 (m = 2), recompute (c = 4, ρ = 4), q = 64."""
    problem = Problem(name="hand", cluster=SEQ_CLUSTER, model=GQA,
                      training=TrainingSpec(seq_len=512, global_batch=2, micro_batch=1, token_block=64))
    plan = SeqPlan.from_rings(problem="hand", batches=[2], rings=[[[(0, 4, 256)], [(1, 4, 128)], [(2, 4, 128)]]])
    assert validate(problem, plan) == []
    rep = evaluate(problem, plan).replicas[0]
    clin2 = 4 * 128 * 2 * 36864 / 20e12  # the slowest linear compute (device 2)
    # ring: (s − T_g)·b·2·kv·d·β = (s − T_g)·128 bytes + (G − 1)·lat; g0 ← g2 and g2 ← g1 cross the bridge
    ring = [256 * 128 / 4e9 + 2 * 80e-6, 384 * 128 / 100e9 + 2 * 5e-6, 384 * 128 / 4e9 + 2 * 80e-6]
    for g, expected in zip(rep.groups, ring):
        assert close(g.ring_s, expected)
    layer = clin2 + 4 * ring[2]  # 4·T_ring outweighs every attention compute (≤ 1.7 µs)
    # ZeRO over N = 3: bw_r = min(100, 4, 4) = 4 GB/s, α_r = 80 µs; ag(3, x) = 2/3·x/4e9 + 2·80e-6
    def ag(x):
        return 2 / 3 * x / 4e9 + 2 * 80e-6
    z_layer, z_ends = 3 * ag(36992 * 2) + ag(36992 * 2), 3 * ag(32832 * 2) + ag(32832 * 2)
    head = max(4 * 256 * 2 * 256 * 64 / 50e12, 4 * 128 * 2 * 256 * 64 / 20e12)
    t_mb = 2 * (layer + z_layer) + head + z_ends
    assert close(rep.layer_s, layer) and close(rep.zero_layer_s, z_layer) and rep.zero_bw_gbps == 4
    assert close(rep.micro_batch_s, t_mb) and close(iteration_time(problem, plan), 2 * t_mb)
    # over the bridge (the runtime's bytes, planner.sequence.bridge): g0 (after g2) and g2 (after
    # g1) cross; a K/V pass carries (s − T_g)·b·2·kv·d·β = 256·128 and 384·128 bytes, ρ − 1 = 3
    # passes, and the gradient pass all s = 512 rows (each block's gradient hops home), L = 2,
    # m = 2; ZeRO over N = 3, V = 2: (V − 1)·(gathers·β + γ)·3·⌈P_u/3⌉ a micro-batch, the
    # embedding (16384 → 16386) gathered once, each layer (36992 → 36993) and the head
    # (16448 → 16449) twice: 4·16386 + 2·6·36993 + 6·16449 = 608154
    traffic = sequence_bridge_traffic(problem, plan)
    ring_rows = (3 * 256 + 512) + (3 * 384 + 512)
    assert traffic.bytes_by_kind == {"ring": ring_rows * 128 * 2 * 2, "zero": 608154 * 2, "dp": 0}
    catt_max = 4 * 4 * 64 * 64 * 513 / 20e12  # device 2's attention (π = 20e12), the largest
    assert close(traffic.bridge_s, 2 * 2 * (4 * ring[2] - catt_max) + 2 * (2 * z_layer + z_ends))


def test_vendor_rules_name_the_vendors():
    problem = Problem(name="hand", cluster=SEQ_CLUSTER, model=GQA,
                      training=TrainingSpec(seq_len=512, global_batch=1, micro_batch=1, token_block=64))
    mixed_group = SeqPlan.from_rings(problem="hand", batches=[1], rings=[[[(0, 2, 256), (2, 2, 256)]]])
    messages = [v.message for v in validate(problem, mixed_group) if v.rule == "vendor"]
    assert messages and "nvidia devices [0]" in messages[0] and "amd devices [2]" in messages[0]
    # a TP stage lives on one machine of one GPU type; one spanning both vendors says so
    layered = Problem(cluster=MIXED4, model=MODEL_M, training=TrainingSpec(seq_len=128, global_batch=1))
    spanning = Plan.model_validate({"pipelines": [{"batch": 1, "stages": [{"devices": [0, 1], "layers": 4}]}]})
    found = [v.message for v in validate(layered, spanning) if v.rule == "machine"]
    assert found and "mixes nvidia and amd" in found[0]


def mixed_exact_problem(bridge_gbps: float) -> Problem:
    """2 × NV on one machine, 1 × AM, 1 × NV: a tiny instance where the bridge matters."""
    cluster = Cluster(name="mx", gpu_types=(NV, AM), inter_bw_gbps=25, cross_vendor_bw_gbps=bridge_gbps,
                      machines=(Machine(name="n0", gpu="NV", count=2, intra_bw_gbps=100),
                                Machine(name="a0", gpu="AM", count=1, intra_bw_gbps=100),
                                Machine(name="n1", gpu="NV", count=1, intra_bw_gbps=100)))
    model = ModelSpec(name="mm", layers=3, hidden=512, heads=4, kv_heads=4, ffn_hidden=1024, vocab=8000)
    return Problem(name="mx", cluster=cluster, model=model,
                   training=TrainingSpec(seq_len=1024, global_batch=4, micro_batch=1, reserved_gib=0))


def test_exact_layered_solvers_price_the_bridge():
    """CP-SAT and MILP reach brute force's optimum (the evaluator's T) on a mixed instance
    with a slow bridge, and that optimum differs from the one with a fast bridge."""
    slow, fast = mixed_exact_problem(0.05), mixed_exact_problem(1000)
    truth = brute.solve(slow)
    for solver in (cpsat, milp):
        result = solver.solve(slow, SolverOptions(time_limit_s=60))
        assert result.objective_s == pytest.approx(iteration_time(slow, result.plan), rel=1e-12)
        assert result.objective_s == pytest.approx(truth.objective_s, rel=1e-5)
        assert result.bound_s <= truth.objective_s * (1 + 1e-5)
    assert brute.solve(fast).objective_s < truth.objective_s * 0.9


def test_exact_sequence_solvers_price_the_bridge():
    """Sequence CP-SAT and MILP reach brute force's optimum on a mixed 2 + 2 cluster of slow
    GPUs (compute dominates); a slow bridge keeps the optimum on one vendor, a free one uses
    all four devices and halves T."""
    from solvers.sequence import brute as seq_brute
    from solvers.sequence.exact import cpsat as seq_cpsat, milp as seq_milp
    slow_nv = GpuType(name="SN", vendor="nvidia", peak_tflops=0.5, memory_gib=16)
    slow_am = GpuType(name="SM", vendor="amd", peak_tflops=0.5, memory_gib=16)

    def problem(bridge_gbps, bridge_us):
        cluster = Cluster(name="mx", gpu_types=(slow_nv, slow_am), inter_bw_gbps=100, inter_latency_us=30,
                          cross_vendor_bw_gbps=bridge_gbps, cross_vendor_latency_us=bridge_us,
                          machines=(Machine(name="m0", gpu="SN", count=2, intra_bw_gbps=100),
                                    Machine(name="m1", gpu="SM", count=2, intra_bw_gbps=100)))
        return Problem(name="mx", cluster=cluster, model=GQA,
                       training=TrainingSpec(seq_len=512, global_batch=2, micro_batch=1, token_block=64))
    slow = problem(0.01, 50)
    truth = seq_brute.solve(slow)
    for solver in (seq_cpsat, seq_milp):
        result = solver.solve(slow, SolverOptions(time_limit_s=60))
        assert result.objective_s == pytest.approx(iteration_time(slow, result.plan), rel=1e-12)
        assert result.objective_s == pytest.approx(truth.objective_s, rel=1e-5)
    assert len(truth.plan.devices) == 2
    assert seq_brute.solve(problem(1000, 0)).objective_s < truth.objective_s * 0.6


def test_the_partitioner_sees_bridged_bandwidths():
    """A rack of nvidia and amd machines: the heuristic's device graph weighs the rack pairs
    across vendors by the bridged bandwidth (the lightest inter-machine edges), and the pairs
    inside a vendor by the rack's."""
    from planner.hardware import Rack
    from solvers.layered.heuristic.partition import _device_graph, _machine_pairs
    machines = tuple(Machine(name=f"m{i}", gpu=g, count=1, intra_bw_gbps=100) for i, g in enumerate("NANA"))
    machines = tuple(m.model_copy(update={"gpu": {"N": "NV", "A": "AM"}[m.gpu]}) for m in machines)
    cluster = Cluster(machines=machines, gpu_types=(NV, AM), inter_bw_gbps=1, cross_vendor_bw_gbps=2,
                      racks=(Rack(machines=("m0", "m1", "m2", "m3"), bw_gbps=50),))
    i, j = _machine_pairs(cluster)
    assert sorted(zip(i.tolist(), j.tolist())) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    xadj, adjncy, weights = _device_graph(cluster)
    weight = {(a, int(b)): int(w) for a in range(4) for b, w in zip(adjncy[xadj[a]:xadj[a + 1]], weights[xadj[a]:xadj[a + 1]])}
    cross, same = weight[(0, 1)], weight[(0, 2)]  # m0–m1 nvidia–amd at min(50, 2) = 2 GB/s; m0–m2 both nvidia
    assert cross < same and weight[(1, 3)] == same and weight[(2, 3)] == cross
