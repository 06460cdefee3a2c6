"""Hand-checked evaluations: every expected number below is worked out by hand from docs/cost-model.md
§3, written as plain arithmetic (no call into planner.cost), and must match `evaluate` to
1e-9 relative.

The clusters use two made-up GPU types with round figures so that the arithmetic is easy:
G100 (100 TFLOP/s peak, η 0.5 → π = 50e12 FLOP/s, 16 GiB) and G50 (40 TFLOP/s, η 0.5 →
π = 20e12, 8 GiB).
"""

from __future__ import annotations

import pytest

from planner import Cluster, GpuType, Machine, ModelSpec, Plan, Problem, TrainingSpec, evaluate, validate
from planner.layered.pricing import iteration_time

GIB = 2**30
REL = 1e-9

G100 = GpuType(name="G100", peak_tflops=100, memory_gib=16, efficiency=0.5)
G50 = GpuType(name="G50", peak_tflops=40, memory_gib=8, efficiency=0.5)


def two_machine_cluster(intra_latency_us_m1: float | None = None, m1_count: int = 1) -> Cluster:
    """m0: 2×G100 at 100 GB/s (5 µs); m1: G50 at 10 GB/s; 10 GB/s and 30 µs between them."""
    return Cluster(
        name="hand", gpu_types=(G100, G50), inter_bw_gbps=10, inter_latency_us=30, intra_latency_us=5,
        machines=(Machine(name="m0", gpu="G100", count=2, intra_bw_gbps=100),
                  Machine(name="m1", gpu="G50", count=m1_count, intra_bw_gbps=10,
                          intra_latency_us=intra_latency_us_m1)),
    )


def plan_of(*pipelines) -> Plan:
    return Plan.model_validate({"pipelines": [
        {"batch": batch, "stages": [{"devices": list(d), "layers": n} for d, n in stages]}
        for batch, stages in pipelines
    ]})


# Model M: L=4, h=64, a=4, k=4 (d=16), f=128, V=256, gated.
#   P_layer = h(h + 2kd) + h² + 3hf + 2h = 64·192 + 4096 + 24576 + 128 = 41088
#   P_emb = V·h = 16384 ; P_head = V·h + h = 16448
#   with s = 128: F_layer = 2·P_mm + 2h(s+1) (causal) = 2·40960 + 2·64·129 = 81920 + 16512 = 98432 ;
#   F_head = 2Vh = 32768
MODEL_M = ModelSpec(name="m", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=128, vocab=256)


def close(actual: float, expected: float) -> bool:
    return actual == pytest.approx(expected, rel=REL, abs=0)


def test_one_pipeline_two_stages():
    problem = Problem(cluster=two_machine_cluster(), model=MODEL_M,
                      training=TrainingSpec(seq_len=128, global_batch=4, micro_batch=1))
    # stage 0: devices 0,1 on m0 (t=2), layers 0-2 + embedding; stage 1: device 2 on m1, layer 3 + head
    plan = plan_of((4, [((0, 1), 3), ((2,), 1)]))
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    # recompute: c = 4, r = 6; A = b·s·h·β = 1·128·64·2 = 16384 bytes; m = 4
    # stage 0: C = 4·1·128·(3·98432) / (2·50e12) = 512·295296 / 1e14
    c0 = 151191552 / 1e14
    # T_tp = 3·6·allreduce(2, A, 100, 5 µs) = 18·(2·1/2·16384/1e11 + 2·1·5e-6)
    tp0 = 18 * (1.6384e-7 + 1e-5)
    tau0 = c0 + tp0
    # T_pp,0 = 2·(p2p(A, 10 GB/s, 30 µs) + bcast(1, ...) = 0) = 2·(16384/1e10 + 3e-5)
    pp0 = 2 * (1.6384e-6 + 3e-5)
    # stage 1: C = 4·128·(98432 + 32768) / (1·20e12); no TP traffic
    c1 = 512 * 131200 / 2e13
    tau1 = c1
    # 1F1B: Σ τ + Σ T_pp + (m − 1)·max(τ0, T_pp0, τ1); τ0 is the largest
    assert tau0 > pp0 > tau1
    t_pipe = tau0 + tau1 + pp0 + 3 * tau0
    s0, s1 = est.pipelines[0].stages
    assert close(s0.compute_s, c0) and close(s0.tp_s, tp0) and close(s0.tau_s, tau0)
    assert close(s0.pp_s, pp0) and s1.pp_s == 0 and s1.tp_s == 0 and close(s1.compute_s, c1)
    assert close(est.pipe_s, t_pipe) and est.dp_s == 0 and close(est.iteration_s, t_pipe)
    assert close(iteration_time(problem, plan), t_pipe)
    # memory, stage 0 (first, k=0, S=2, q = min(2, 4) = 2, t=2):
    #   W = 16·(3·41088 + 16384)/2 = 1117184 ; sbh = 128·1·64 = 8192
    #   a_full = 8192·(10 + 24/2) = 180224 ; a_ckpt = 2·8192 = 16384
    #   Act = 2·3·16384 + 180224 = 278528 ; + R = 2 GiB
    assert close(s0.memory_gib, (1117184 + 278528 + 2 * GIB) / GIB)
    # stage 1 (last, k=1, q = 1, t=1): W = 16·(41088 + 16448) = 920576
    #   Act = 1·1·16384 + 8192·34 + 4·1·128·256/1 = 16384 + 278528 + 131072
    assert close(s1.memory_gib, (920576 + 425984 + 2 * GIB) / GIB)
    assert close(s1.headroom_gib, 8 - (920576 + 425984 + 2 * GIB) / GIB)
    # throughput B·s/T; MFU = 3·B·s·(L·F_layer + F_head) / (T · (2·100 + 40)e12)
    assert close(est.tokens_per_s, 4 * 128 / t_pipe)
    assert close(est.mfu, 3 * 4 * 128 * (4 * 98432 + 32768) / (t_pipe * 240e12))
    assert est.bottleneck.kind == "tensor_parallel" and est.bottleneck.stage == 0


def test_two_pipelines_with_different_tp_hold_the_same_layers():
    problem = Problem(cluster=two_machine_cluster(), model=MODEL_M,
                      training=TrainingSpec(seq_len=128, global_batch=8, micro_batch=2))
    # pipeline 0: all 4 layers on devices 0,1 (t=2), B_0 = 6 → m = 3
    # pipeline 1: all 4 layers on device 2 (t=1),   B_1 = 2 → m = 1
    plan = plan_of((6, [((0, 1), 4)]), (2, [((2,), 4)]))
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    # A = 2·128·64·2 = 32768 bytes
    # pipeline 0: C = 4·2·128·(4·98432 + 32768) / (2·50e12) = 1024·426496 / 1e14
    c_a = 436731904 / 1e14
    #   T_tp = 4·6·allreduce(2, 32768, 100, 5 µs) = 24·(32768/1e11 + 1e-5)
    tp_a = 24 * (3.2768e-7 + 1e-5)
    pipe_a = 3 * (c_a + tp_a)  # one stage: τ + (3 − 1)·τ
    # pipeline 1: C = 1024·426496 / (1·20e12), no TP, m = 1
    pipe_b = 436731904 / 2e13
    # DP sync, D = 2: every layer's holders are the two stages: t_min = 1; the holders sit on
    # m0 and m1, so bw_min = 10 GB/s and α_max = 30 µs (no two holders share a machine)
    #   τ_dp(layer) = 2·1/2·41088·2/1e10 + 2·1·3e-5
    #   τ_dp(emb)   = 16384·2/1e10 + 6e-5 ; τ_dp(head) = 16448·2/1e10 + 6e-5
    layer = 82176 / 1e10 + 6e-5
    emb = 32768 / 1e10 + 6e-5
    head = 32896 / 1e10 + 6e-5
    t_dp = 4 * layer + emb + head  # each stage holds all of them, one after another
    assert close(est.pipelines[0].time_s, pipe_a) and close(est.pipelines[1].time_s, pipe_b)
    assert close(est.dp_s, t_dp)
    assert close(est.iteration_s, max(pipe_a, pipe_b) + t_dp)
    assert all(close(s.dp_s, t_dp) for s in est.stages)
    # memory (single stage, q = min(1, m) = 1): sbh = 128·2·64 = 16384, a_ckpt = 32768
    #   pipeline 0 (t=2): W = 16·(4·41088 + 16384 + 16448)/2 = 1577472
    #     Act = 4·32768 + 16384·22 + 4·2·128·256/2 = 131072 + 360448 + 131072
    #   pipeline 1 (t=1): W = 16·197184 = 3154944
    #     Act = 4·32768 + 16384·34 + 4·2·128·256 = 131072 + 557056 + 262144
    assert close(est.stages[0].memory_gib, (1577472 + 622592 + 2 * GIB) / GIB)
    assert close(est.stages[1].memory_gib, (3154944 + 950272 + 2 * GIB) / GIB)


def test_recompute_off_plain_mlp_gqa():
    # Model N: L=2, h=32, a=4, k=2 (d=8), f=64, V=100, plain MLP.
    #   P_layer = 32·(32 + 2·2·8) + 32² + 2·32·64 + 2·32 = 2048 + 1024 + 4096 + 64 = 7232
    #   P_emb = 3200 ; P_head = 3232 ; s = 64: F_layer = 2·(7232 − 64) + 2·32·65 = 14336 + 4160 = 18496 ;
    #   F_head = 2·100·32 = 6400
    model = ModelSpec(name="n", layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=100,
                      gated=False)
    problem = Problem(cluster=two_machine_cluster(intra_latency_us_m1=8, m1_count=2), model=model,
                      training=TrainingSpec(seq_len=64, global_batch=2, micro_batch=1, recompute=False))
    plan = plan_of((2, [((0, 1), 1), ((2, 3), 1)]))  # m0 t=2 then m1 t=2, one layer each, m = 2
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    # no recompute: c = 3, r = 4 ; A = 1·64·32·2 = 4096
    c0 = 3 * 64 * 18496 / (2 * 50e12)
    tp0 = 1 * 4 * (4096 / 1e11 + 1e-5)  # allreduce(2, A, 100, 5 µs)
    # T_pp,0 = 2·(p2p(A, 10, 30 µs) + bcast(2, A, 10, 8 µs)) = 2·(4096/1e10 + 3e-5 + ½·4096/1e10 + 8e-6)
    pp0 = 2 * (4.096e-7 + 3e-5 + 2.048e-7 + 8e-6)
    c1 = 3 * 64 * (18496 + 6400) / (2 * 20e12)
    tp1 = 1 * 4 * (4096 / 1e10 + 2 * 8e-6)  # allreduce(2, A, 10, 8 µs)
    tau0, tau1 = c0 + tp0, c1 + tp1
    assert pp0 > tau1 > tau0  # the pipeline is limited by its activation transfer
    t_pipe = tau0 + tau1 + pp0 + 1 * pp0
    s0, s1 = est.stages
    assert close(s0.tau_s, tau0) and close(s1.tau_s, tau1) and close(s0.pp_s, pp0)
    assert close(est.iteration_s, t_pipe) and est.bottleneck.kind == "pipeline_parallel"
    # memory without recompute keeps a_full per layer per in-flight micro-batch:
    #   sbh = 64·1·32 = 2048 ; a_full(t=2) = 2048·22 = 45056
    #   stage 0: q = min(2, 2) = 2: W = 16·(7232 + 3200)/2 = 83456 ; Act = 2·1·45056 = 90112
    #   stage 1: q = min(1, 2) = 1: W = 16·(7232 + 3232)/2 = 83712 ; Act = 45056 + 4·64·100/2 = 57856
    assert close(s0.memory_gib, (83456 + 90112 + 2 * GIB) / GIB)
    assert close(s1.memory_gib, (83712 + 57856 + 2 * GIB) / GIB)


def test_gpipe_holds_every_micro_batch_and_prices_the_same_time():
    """The plan of test_one_pipeline_two_stages under `schedule: gpipe`: q = m_p = 4 on every
    stage (§3.5); the §3.3 time is the same formula, so T does not change."""
    training = dict(seq_len=128, global_batch=4, micro_batch=1)
    plan = plan_of((4, [((0, 1), 3), ((2,), 1)]))
    one_f = evaluate(Problem(cluster=two_machine_cluster(), model=MODEL_M, training=TrainingSpec(**training)), plan)
    est = evaluate(Problem(cluster=two_machine_cluster(), model=MODEL_M,
                           training=TrainingSpec(**training, schedule="gpipe")), plan)
    assert est.iteration_s == one_f.iteration_s
    s0, s1 = est.pipelines[0].stages
    # stage 0: W = 1117184 as before; Act = q·n·a_ckpt + a_full = 4·3·16384 + 180224 = 376832
    assert close(s0.memory_gib, (1117184 + 376832 + 2 * GIB) / GIB)
    # stage 1: W = 920576; Act = 4·1·16384 + 8192·34 + 4·128·256 = 65536 + 278528 + 131072
    assert close(s1.memory_gib, (920576 + 475136 + 2 * GIB) / GIB)
