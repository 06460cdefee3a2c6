"""Hand-checked evaluations of sequence plans: every expected number below is worked out by
hand from docs/sequence-plans.md §7.2–§7.3, written as plain arithmetic (no call into
planner.sequence.cost), and must match `evaluate` to 1e-9 relative.

Two made-up GPU types with round figures: G100 (100 TFLOP/s peak, η 0.5 → π = 50e12 FLOP/s,
16 GiB) and G50 (40 TFLOP/s, η 0.5 → π = 20e12, 8 GiB). Cluster: m0 = 2×G100 at 100 GB/s,
5 µs (devices 0, 1); m1 = 1×G50 at 10 GB/s (device 2); 10 GB/s and 30 µs between them.
Training: recompute (c = 4, r_a2a = 3, ρ = 4), b = 1, β = γ = 2, μ = 16, R = 2 GiB, q = 64.
"""

from __future__ import annotations

import pytest

from planner import Cluster, GpuType, Machine, ModelSpec, Problem, TrainingSpec
from planner.kinds import evaluate, iteration_time, validate
from planner.sequence import SeqPlan

GIB = 2**30
REL = 1e-9

G100 = GpuType(name="G100", peak_tflops=100, memory_gib=16, efficiency=0.5)
G50 = GpuType(name="G50", peak_tflops=40, memory_gib=8, efficiency=0.5)
CLUSTER = Cluster(
    name="hand", gpu_types=(G100, G50), inter_bw_gbps=10, inter_latency_us=30, intra_latency_us=5,
    machines=(Machine(name="m0", gpu="G100", count=2, intra_bw_gbps=100),
              Machine(name="m1", gpu="G50", count=1, intra_bw_gbps=10)))
TOTAL_PEAK = 2 * 100e12 + 40e12  # every device of the cluster counts in MFU

# MHA model: L=2, h=64, a=4, k=4 (d=16), f=128, V=256, gated.
#   P_layer = 64·(64 + 2·4·16) + 64² + 3·64·128 + 2·64 = 12288 + 4096 + 24576 + 128 = 41088
#   P_layer − 2h = 40960 ; P_emb = 16384 ; P_head = 16448 ; P_emb + P_head = 32832
#   P_total = 2·41088 + 32832 = 115008 ; h + 2kd = 192
MHA = ModelSpec(name="mha", layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=128, vocab=256)
# GQA model: same but k=2: P_layer = 64·(64 + 2·2·16) + 4096 + 24576 + 128 = 36992
#   P_layer − 2h = 36864 ; P_total = 2·36992 + 32832 = 106816
GQA = ModelSpec(name="gqa", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=256)


def close(actual: float, expected: float) -> bool:
    return actual == pytest.approx(expected, rel=REL, abs=0)


def problem_of(model: ModelSpec, batch: int) -> Problem:
    return Problem(name="hand", cluster=CLUSTER, model=model,
                   training=TrainingSpec(seq_len=512, global_batch=batch, micro_batch=1, token_block=64))


def plan_of(*replicas) -> SeqPlan:
    """(batch, [[(device, heads, tokens), …] per group]) per replica."""
    return SeqPlan.from_rings(problem="hand", batches=[b for b, _ in replicas], rings=[r for _, r in replicas])


def test_one_group_two_members_uneven_heads():
    problem = problem_of(MHA, batch=1)
    plan = plan_of((1, [[(0, 3, 320), (1, 1, 192)]]))  # T_g = 512 = s, G = 1, D = 1, N = 2
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    rep = est.replicas[0]
    grp = rep.groups[0]
    m0, m1 = grp.members
    # pairs_g = ℓ·(s+1) = 256·513
    assert close(grp.pairs, 256 * 513) and grp.first_token == 0
    # Clin = c·b·t·2·(P_layer − 2h)/π
    clin0, clin1 = 4 * 320 * 2 * 40960 / 50e12, 4 * 192 * 2 * 40960 / 50e12
    # Catt = c·b·4·h·pairs·(heads/a)/π
    catt0, catt1 = 4 * 4 * 64 * 256 * 513 * 3 / 4 / 50e12, 4 * 4 * 64 * 256 * 513 * 1 / 4 / 50e12
    assert close(m0.linear_s, clin0) and close(m1.linear_s, clin1)
    assert close(m0.attention_s, catt0) and close(m1.attention_s, catt1)
    # qkv exchange, bytes per token (h+2kd)·β = 384:
    #   member 0 sends 320·384·(1 − 3/4) = 30720, receives 192·384·3/4 = 55296
    #   member 1 sends 192·384·(3/4) = 55296, receives 320·384·1/4 = 30720  → max 55296
    qkv = 55296 / 100e9 + 1 * 5e-6
    # output exchange, d·β = 32 bytes per head and token:
    #   member 0 sends 192·3·32 = 18432, receives 320·1·32 = 10240
    #   member 1 sends 320·1·32 = 10240, receives 192·3·32 = 18432      → max 18432
    out = 18432 / 100e9 + 1 * 5e-6
    assert close(grp.a2a_qkv_s, qkv) and close(grp.a2a_out_s, out) and grp.hp_bw_gbps == 100
    assert grp.ring_s == 0 and m0.ring_s == 0  # one group: no ring
    # T_layer = max Clin + 3·a2a + max(max Catt, 4·0)
    layer = clin0 + 3 * (qkv + out) + catt0
    # ZeRO-3 over N = 2 on m0: (c−1)·ag(2, P_layer·β) + ag(2, P_layer·γ), ag = 1/2·x/1e11 + 5e-6
    z_layer = 3 * (82176 / 2 / 100e9 + 5e-6) + (82176 / 2 / 100e9 + 5e-6)
    z_ends = 3 * (65664 / 2 / 100e9 + 5e-6) + (65664 / 2 / 100e9 + 5e-6)
    head = 4 * 320 * 2 * 256 * 64 / 50e12  # Chead of the member with more tokens
    t_mb = 2 * (layer + z_layer) + head + z_ends
    assert close(rep.layer_s, layer) and close(rep.zero_layer_s, z_layer) and close(rep.zero_ends_s, z_ends)
    assert close(rep.head_s, head) and close(rep.micro_batch_s, t_mb) and close(rep.time_s, t_mb)
    assert est.dp_s == 0 and close(est.iteration_s, t_mb) and close(iteration_time(problem, plan), t_mb)
    assert close(est.tokens_per_s, 512 / t_mb)
    # F_iter = 3·B·s·(L·2·40960 + L·2·h·(s+1) + 2·V·h)
    flops = 3 * 1 * 512 * (2 * 2 * 40960 + 2 * 2 * 64 * 513 + 2 * 256 * 64)
    assert close(est.mfu, flops / (t_mb * TOTAL_PEAK))
    # memory of member 0: states 16·115008/2 ; gathered 2·2·41088 ;
    #   a_full = b·h·(26·t + 8·T_g·heads/a) = 64·(26·320 + 8·512·3/4) ; act = L·2·b·t·h + a_full
    #   ring buffers 0 (G = 1) ; logits 4·320·256 ; reserve 2 GiB
    mem0 = 16 * 115008 / 2 + 2 * 2 * 41088 + (2 * 2 * 320 * 64 + 64 * (26 * 320 + 8 * 512 * 3 / 4)) \
        + 0 + 4 * 320 * 256 + 2 * GIB
    mem1 = 16 * 115008 / 2 + 2 * 2 * 41088 + (2 * 2 * 192 * 64 + 64 * (26 * 192 + 8 * 512 * 1 / 4)) \
        + 0 + 4 * 192 * 256 + 2 * GIB
    assert close(m0.memory_gib * GIB, mem0) and close(m1.memory_gib * GIB, mem1)
    assert close(m0.headroom_gib, 16 - mem0 / GIB) and close(est.min_headroom_gib, 16 - mem0 / GIB)
    assert close(m0.states_gib * GIB, 16 * 115008 / 2) and m0.ring_buffers_gib == 0
    assert close(m0.logits_gib * GIB, 4 * 320 * 256)


def test_ring_of_three_groups_uneven_tokens():
    problem = problem_of(GQA, batch=2)  # m = 2 micro-batches
    # g0 = device 0 (256 tokens), g1 = device 1 (128), g2 = device 2 on m1 (128); every member all heads
    plan = plan_of((2, [[(0, 4, 256)], [(1, 4, 128)], [(2, 4, 128)]]))
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    rep = est.replicas[0]
    g0, g1, g2 = rep.groups
    # mirrored layout: x_0 = 0, x_1 = ℓ_0 = 128, x_2 = 128 + 64 = 192
    assert [g.first_token for g in rep.groups] == [0, 128, 192]
    assert close(g0.pairs, 128 * 513) and close(g1.pairs, 64 * 513) and close(g2.pairs, 64 * 513)
    clin = [4 * 256 * 2 * 36864 / 50e12, 4 * 128 * 2 * 36864 / 50e12, 4 * 128 * 2 * 36864 / 20e12]
    catt = [4 * 4 * 64 * 128 * 513 / 50e12, 4 * 4 * 64 * 64 * 513 / 50e12, 4 * 4 * 64 * 64 * 513 / 20e12]
    # ring: b·(s − T_g)·2·kv·d·β with kv = 4·2/4 = 2 → (s − T_g)·128 bytes, + (G−1)·lat
    #   g0 from g2 (m1 → m0: 10 GB/s, 30 µs); g1 from g0 (inside m0: 100 GB/s, 5 µs); g2 from g1 (10, 30 µs)
    ring = [256 * 128 / 10e9 + 2 * 30e-6, 384 * 128 / 100e9 + 2 * 5e-6, 384 * 128 / 10e9 + 2 * 30e-6]
    for g, cl, ca, ri in zip(rep.groups, clin, catt, ring):
        assert close(g.members[0].linear_s, cl) and close(g.members[0].attention_s, ca)
        assert close(g.members[0].ring_s, ri) and close(g.ring_s, ri) and g.a2a_s == 0
    assert (g0.ring_bw_gbps, g1.ring_bw_gbps, g2.ring_bw_gbps) == (10, 100, 10)
    # T_layer = max Clin + 0 + max(max Catt, 4·T_ring); here the ring hides behind nothing
    assert 4 * ring[2] > max(catt)
    layer = clin[2] + 4 * ring[2]
    # ZeRO over N = 3: bw_r = min(100, 10, 10) = 10, α_r = 30 µs; ag(3, x) = 2/3·x/1e10 + 2·30e-6
    z_layer = 3 * (2 / 3 * 36992 * 2 / 10e9 + 2 * 30e-6) + (2 / 3 * 36992 * 2 / 10e9 + 2 * 30e-6)
    z_ends = 3 * (2 / 3 * 32832 * 2 / 10e9 + 2 * 30e-6) + (2 / 3 * 32832 * 2 / 10e9 + 2 * 30e-6)
    head = max(4 * 256 * 2 * 256 * 64 / 50e12, 4 * 128 * 2 * 256 * 64 / 20e12)
    t_mb = 2 * (layer + z_layer) + head + z_ends
    assert close(rep.ring_s, 4 * ring[2]) and close(rep.layer_s, layer)
    assert close(rep.zero_layer_s, z_layer) and close(rep.zero_ends_s, z_ends) and rep.zero_bw_gbps == 10
    assert close(rep.micro_batch_s, t_mb) and close(rep.time_s, 2 * t_mb) and close(est.iteration_s, 2 * t_mb)
    # bottleneck: each term's share of T_rep = m·T_mb; ZeRO traffic (m·(L·Z_layer + Z_ends))
    # narrowly outweighs the ring (m·L·4·T_ring), linear compute and the head are far below
    shares = {"zero": 2 * (2 * z_layer + z_ends), "context_parallel": 2 * 2 * 4 * ring[2],
              "linear_compute": 2 * 2 * clin[2], "lm_head": 2 * head}
    assert est.bottleneck.kind == max(shares, key=shares.get) == "zero"
    assert close(est.bottleneck.seconds, shares["zero"])
    flops = 3 * 2 * 512 * (2 * 2 * 36864 + 2 * 2 * 64 * 513 + 2 * 256 * 64)
    assert close(est.mfu, flops / (2 * t_mb * TOTAL_PEAK))
    # memory of g2's member (G50, 8 GiB): states 16·106816/3 ; gathered 2·2·36992 ;
    #   a_full = 64·(26·128 + 8·128·1) ; act = 2·2·128·64 + a_full ;
    #   ring buffers 2·b·T_max·2·kv·d·β = 2·256·2·2·16·2 ; logits 4·128·256
    mem2 = 16 * 106816 / 3 + 2 * 2 * 36992 + (2 * 2 * 128 * 64 + 64 * (26 * 128 + 8 * 128)) \
        + 2 * 256 * 2 * 2 * 16 * 2 + 4 * 128 * 256 + 2 * GIB
    m2 = g2.members[0]
    assert close(m2.memory_gib * GIB, mem2) and close(m2.headroom_gib, 8 - mem2 / GIB)
    assert close(m2.ring_buffers_gib * GIB, 2 * 256 * 2 * 2 * 16 * 2)


def test_two_replicas():
    problem = problem_of(MHA, batch=3)
    # replica 0 (batch 2): one group, devices 0 and 1, 2 heads and 256 tokens each;
    # replica 1 (batch 1): device 2 alone
    plan = plan_of((2, [[(0, 2, 256), (1, 2, 256)]]), (1, [[(2, 4, 512)]]))
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    r0, r1 = est.replicas
    # replica 0: both members send and receive 256·384·1/2 = 49152 (qkv) and 256·2·32 = 16384 (out)
    qkv, out = 49152 / 100e9 + 5e-6, 16384 / 100e9 + 5e-6
    layer0 = 4 * 256 * 2 * 40960 / 50e12 + 3 * (qkv + out) + 4 * 4 * 64 * 256 * 513 * 2 / 4 / 50e12
    z_layer0 = 4 * (82176 / 2 / 100e9 + 5e-6)
    z_ends0 = 4 * (65664 / 2 / 100e9 + 5e-6)
    t_mb0 = 2 * (layer0 + z_layer0) + 4 * 256 * 2 * 256 * 64 / 50e12 + z_ends0
    # replica 1: one device: no all-to-all, no ring, no ZeRO traffic
    layer1 = 4 * 512 * 2 * 40960 / 20e12 + 4 * 4 * 64 * 256 * 513 / 20e12
    t_mb1 = 2 * layer1 + 4 * 512 * 2 * 256 * 64 / 20e12
    assert close(r0.layer_s, layer0) and close(r0.micro_batch_s, t_mb0) and close(r0.time_s, 2 * t_mb0)
    assert close(r1.layer_s, layer1) and r1.zero_layer_s == 0 and r1.zero_ends_s == 0 and r1.zero_bw_gbps is None
    assert close(r1.time_s, t_mb1) and r1.groups[0].hp_bw_gbps is None
    # T_dp = allreduce(2, P_total·γ / min N_r, bw_x, α_x) with min N_r = 1 and the
    # replicas meeting only across m0–m1 (10 GB/s, 30 µs): 2·1/2·230016/1e10 + 2·30e-6
    dp = 230016 / 10e9 + 2 * 30e-6
    t = max(2 * t_mb0, t_mb1) + dp
    assert close(est.dp_s, dp) and est.dp_bw_gbps == 10
    assert close(est.iteration_s, t) and close(iteration_time(problem, plan), t)
    assert close(est.tokens_per_s, 3 * 512 / t)
    # memory: replica 1's device holds every state (N = 1): 16·115008 ; act = 2·2·512·64 + 64·(26·512 + 8·512)
    mem_r1 = 16 * 115008 + 2 * 2 * 41088 + (2 * 2 * 512 * 64 + 64 * (26 * 512 + 8 * 512)) + 4 * 512 * 256 + 2 * GIB
    assert close(r1.groups[0].members[0].memory_gib * GIB, mem_r1)


def test_without_recompute():
    # the ring of two groups on m0 and m1, MHA, recompute off: c = 3, r_a2a = 2, ρ = 3,
    # activations L·a_full; g0 = devices 0, 1 (2 heads, 128 tokens each), g1 = device 2 (256 tokens)
    problem = Problem(name="hand", cluster=CLUSTER, model=MHA, training=TrainingSpec(
        seq_len=512, global_batch=1, micro_batch=1, token_block=64, recompute=False))
    plan = plan_of((1, [[(0, 2, 128), (1, 2, 128)], [(2, 4, 256)]]))
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    rep = est.replicas[0]
    g0, g1 = rep.groups
    # g0: qkv each member sends 128·384·1/2 = 24576 and receives 128·384·1/2 = 24576;
    #     output sends 128·2·32 = 8192 and receives 128·2·32 = 8192
    a2a = (24576 / 100e9 + 5e-6) + (8192 / 100e9 + 5e-6)
    assert close(g0.a2a_s, a2a) and g1.a2a_s == 0
    # ring: b·(s − T_g)·2·kv_i·d·β, both directions across m0–m1 (10 GB/s, (G−1)·30 µs);
    #   g0's members hold 2 heads → kv = 2·4/4 = 2: 256·2·2·16·2 = 256·128 bytes
    #   g1's member holds 4 kv heads: 256·2·4·16·2 = 256·256 bytes
    ring0, ring1 = 256 * 128 / 10e9 + 30e-6, 256 * 256 / 10e9 + 30e-6
    assert close(g0.ring_s, ring0) and close(g1.ring_s, ring1)
    clin = max(3 * 128 * 2 * 40960 / 50e12, 3 * 256 * 2 * 40960 / 20e12)
    catt = max(3 * 4 * 64 * 128 * 513 * 2 / 4 / 50e12, 3 * 4 * 64 * 128 * 513 / 20e12)
    layer = clin + 2 * a2a + max(catt, 3 * max(ring0, ring1))
    # ZeRO over N = 3 (bw 10, 30 µs): (c−1) = 2 gathers and one reduce-scatter
    z_layer = 2 * (2 / 3 * 82176 / 10e9 + 2 * 30e-6) + (2 / 3 * 82176 / 10e9 + 2 * 30e-6)
    z_ends = 2 * (2 / 3 * 65664 / 10e9 + 2 * 30e-6) + (2 / 3 * 65664 / 10e9 + 2 * 30e-6)
    head = max(3 * 128 * 2 * 256 * 64 / 50e12, 3 * 256 * 2 * 256 * 64 / 20e12)
    t = 2 * (layer + z_layer) + head + z_ends
    assert close(rep.layer_s, layer) and close(est.iteration_s, t)
    # memory of device 2: states 16·115008/3 ; gathered 2·2·41088 ;
    #   a_full = 64·(26·256 + 8·256·4/4), activations L·a_full ;
    #   ring buffers 2·b·T_max·2·kv·d·β = 2·256·2·4·16·2 ; logits 4·256·256
    mem = 16 * 115008 / 3 + 2 * 2 * 41088 + 2 * 64 * (26 * 256 + 8 * 256) + 2 * 256 * 2 * 4 * 16 * 2 \
        + 4 * 256 * 256 + 2 * GIB
    assert close(g1.members[0].memory_gib * GIB, mem)
    assert close(g1.members[0].activations_gib * GIB, 2 * 64 * (26 * 256 + 8 * 256))
