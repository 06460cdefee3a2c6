"""The vectorized evaluator against a second, deliberately naive reading of docs/cost-model.md §3.

The reference below walks every stage, layer and pair of holders with plain Python loops and
device-level bw()/lat() lookups, written from the text of the docs without using the cost
modules (causal attention at η_att, qkv biases, tied embeddings, sequence parallelism, ZeRO-1). Agreement on random plans over random clusters checks the numpy code paths
(segment grouping of layers, reduceat over pipelines, diagonal handling in bw_min)."""

from __future__ import annotations

import math
import random

import pytest

from planner import Cluster, GpuType, Link, Machine, ModelSpec, Pipeline, Plan, Problem, Stage, TrainingSpec
from planner.layered.evaluate import evaluate

GPUS = ["A100-80G", "RTX4090", "RTX3090", "H20", "V100"]


def ar(n, x, bw, a):
    return 0.0 if n <= 1 else 2 * (n - 1) / n * x / (bw * 1e9) + 2 * (n - 1) * a


def bc(n, x, bw, a):
    return 0.0 if n <= 1 else (n - 1) / n * x / (bw * 1e9) + (n - 1) * a


class Naive:
    """The model's sizes and FLOPs (docs/cost-model.md §3, its helpers and per-token work) and
    device-level bw()/lat(), read from the problem by hand."""

    def __init__(self, problem: Problem):
        self.cl, self.mo, self.tr = cl, mo, tr = problem.cluster, problem.model, problem.training
        self.h, self.s, self.b, self.V = h, s, b, V = mo.hidden, tr.seq_len, tr.micro_batch, mo.vocab
        d, k = h // mo.heads, mo.kv_heads or mo.heads
        bias = (h + 2 * k * d) if mo.qkv_bias else 0
        self.p_mm = h * (h + 2 * k * d) + h * h + (3 if mo.gated else 2) * h * mo.ffn_hidden
        self.p_layer, self.p_emb, self.p_head = self.p_mm + 2 * h + bias, V * h, V * h + h
        self.f_mm, self.f_att, self.f_head = 2 * self.p_mm, 2 * h * (s + 1), 2 * V * h
        self.c, self.r = (4, 6) if tr.recompute else (3, 4)
        self.A = b * s * h * tr.act_bytes

    def machine(self, dev):
        acc = 0
        for i, m in enumerate(self.cl.machines):
            acc += m.count
            if dev < acc:
                return i

    def gpu(self, dev):
        return self.cl.catalog[self.cl.machines[self.machine(dev)].gpu]

    def bw_lat(self, i, j):  # device-level bw(i,j), lat(i,j) of §1
        cl, mi, mj = self.cl, self.machine(i), self.machine(j)
        if mi == mj:
            m = cl.machines[mi]
            return m.intra_bw_gbps, (m.intra_latency_us if m.intra_latency_us is not None else cl.intra_latency_us) * 1e-6
        for ln in cl.links:
            if {ln.a, ln.b} == {cl.machines[mi].name, cl.machines[mj].name}:
                lat = ln.latency_us if ln.latency_us is not None else cl.inter_latency_us
                return ln.bw_gbps, lat * 1e-6
        return cl.inter_bw_gbps, cl.inter_latency_us * 1e-6


def reference(problem: Problem, plan: Plan) -> dict:
    x = Naive(problem)
    pipes, holders = pipeline_times(x, plan)
    stage_dp = stage_syncs(x, plan, holders)
    return {"T": max(pipes) + max(stage_dp.values()), "pipes": pipes, "dp": max(stage_dp.values()),
            "stage_dp": stage_dp, "memory": memory(x, plan)}


def pipeline_times(x: Naive, plan: Plan) -> tuple[list[float], dict]:
    """Each pipeline's Σ τ + Σ pp + (m − 1)·max(τ, pp), and holders[layer] = [(pipeline, stage)]."""
    pipes, holders, b = [], {}, x.b
    for p, pipe in enumerate(plan.pipelines):
        S, m = len(pipe.stages), pipe.batch // b
        taus, pps, start = [], [], 0
        for kk, st in enumerate(pipe.stages):
            t, n, dev0 = len(st.devices), st.layers, st.devices[0]
            last, first = kk == S - 1, kk == 0
            g = x.gpu(dev0)
            bw_s, a_s = x.bw_lat(dev0, dev0)
            pi, eta_att = g.peak_tflops * 1e12, g.attention_efficiency or g.efficiency
            C = x.c * b * x.s * (n * (x.f_mm / (pi * g.efficiency) + x.f_att / (pi * eta_att))
                                 + (x.f_head / (pi * g.efficiency) if last else 0)) / t
            taus.append(C + n * x.r * ar(t, x.A, bw_s, a_s))
            if last:
                pps.append(0.0)
            else:
                nxt = pipe.stages[kk + 1]
                bw_l, a_l = x.bw_lat(dev0, nxt.devices[0])
                bw_n, a_n = x.bw_lat(nxt.devices[0], nxt.devices[0])
                pps.append(2 * (x.A / (bw_l * 1e9) + a_l + bc(len(nxt.devices), x.A, bw_n, a_n)))
            for layer in range(start, start + n):
                holders.setdefault(layer, []).append((p, kk))
            ends = ["tied"] if x.mo.tied_embeddings else ["emb", "head"]
            if first:
                holders.setdefault(ends[0], []).append((p, kk))
            if last and not (x.mo.tied_embeddings and first):
                holders.setdefault(ends[-1], []).append((p, kk))
            start += n
        pipes.append(sum(taus) + sum(pps) + (m - 1) * max(max(a, c) for a, c in zip(taus, pps)))
    return pipes, holders


def stage_syncs(x: Naive, plan: Plan, holders: dict) -> dict:
    """Per (pipeline, stage): the sum of the syncs of the layers it holds (T_dp is their max)."""
    tau_dp = {}
    for layer, hs in holders.items():
        n_sync = len(hs)  # D holders, or every first and last stage for the tied embedding
        if n_sync == 1:
            tau_dp[layer] = 0.0
            continue
        stages = [plan.pipelines[p].stages[kk] for p, kk in hs]
        t_min = min(len(st.devices) for st in stages)
        pairs = [x.bw_lat(a.devices[0], c.devices[0]) for i, a in enumerate(stages) for c in stages[i + 1:]]
        bw, lat = min(q[0] for q in pairs), max(q[1] for q in pairs)
        params = x.p_emb if layer in ("emb", "tied") else x.p_head if layer == "head" else x.p_layer
        tr = x.tr
        if tr.zero_stage == 1 and layer != "tied":  # reduce-scatter the gradient, all-gather the weights
            tau_dp[layer] = (bc(n_sync, params * tr.grad_bytes / t_min, bw, lat)
                             + bc(n_sync, params * tr.weight_bytes / t_min, bw, lat))
        else:
            tau_dp[layer] = ar(n_sync, params * tr.grad_bytes / t_min, bw, lat)
    stage_dp = {}
    for layer, hs in holders.items():
        for key in hs:
            stage_dp[key] = stage_dp.get(key, 0.0) + tau_dp[layer]
    return stage_dp


def memory(x: Naive, plan: Plan) -> dict:
    """Per (pipeline, stage): weights and optimizer state, activations in flight, reserved bytes."""
    out, tr, s, b, h, D = {}, x.tr, x.s, x.b, x.h, len(plan.pipelines)
    for p, pipe in enumerate(plan.pipelines):
        S, m = len(pipe.stages), pipe.batch // b
        for kk, st in enumerate(pipe.stages):
            t, n, first, last = len(st.devices), st.layers, kk == 0, kk == len(pipe.stages) - 1
            mu = tr.param_state_bytes
            if tr.zero_stage == 1 and D >= 2:
                mu = mu - tr.optimizer_bytes + tr.optimizer_bytes / D
            W = mu * (n * x.p_layer + first * x.p_emb + last * x.p_head) / t
            a_full = 34 * s * b * h / t if tr.sequence_parallel else s * b * h * (10 + 24 / t)
            a_ckpt = 2 * s * b * h / t if tr.sequence_parallel else 2 * s * b * h
            q = min(S - kk, m)
            act = q * n * (a_ckpt if tr.recompute else a_full) + (a_full if tr.recompute else 0)
            act += (4 * b * s * x.V / t) if last else 0
            out[(p, kk)] = W + act + tr.reserved_gib * 2**30
    return out


def random_problem(rng: random.Random) -> Problem:
    machines = [
        Machine(name=f"m{i}", gpu=rng.choice(GPUS), count=rng.choice([1, 2, 4, 8]),
                intra_bw_gbps=rng.choice([16, 32, 300]),
                intra_latency_us=rng.choice([None, 2.0]))
        for i in range(rng.randint(1, 5))
    ]
    links = []
    for i in range(len(machines)):
        for j in range(i + 1, len(machines)):
            if rng.random() < 0.4:
                links.append(Link(a=f"m{i}", b=f"m{j}", bw_gbps=rng.choice([0.5, 5, 25]),
                                  latency_us=rng.choice([None, 100.0])))
    # some types get their own attention efficiency η_att (≠ η)
    types = [GpuType(name=g, peak_tflops=100.0 * (i + 1), memory_gib=24.0 * (i + 1), efficiency=0.5,
                     attention_efficiency=rng.choice([None, 0.2, 0.35, 0.8])) for i, g in enumerate(GPUS[:2])]
    cluster = Cluster(machines=machines, inter_bw_gbps=rng.choice([1.25, 12.5]), links=links, gpu_types=types)
    heads = rng.choice([8, 16])
    model = ModelSpec(layers=rng.randint(1, 12), hidden=heads * 64, heads=heads,
                      kv_heads=rng.choice([heads, heads // 2, 2]), ffn_hidden=rng.choice([1024, 2816]),
                      vocab=rng.choice([1000, 32000]), gated=rng.random() < 0.7,
                      qkv_bias=rng.random() < 0.3, tied_embeddings=rng.random() < 0.3)
    b = rng.choice([1, 2])
    training = TrainingSpec(seq_len=rng.choice([512, 2048]), global_batch=b * rng.randint(4, 24),
                            micro_batch=b, recompute=rng.random() < 0.6,
                            sequence_parallel=rng.random() < 0.3, zero_stage=rng.choice([0, 0, 1]))
    return Problem(cluster=cluster, model=model, training=training)


def random_plan(problem: Problem, rng: random.Random) -> Plan | None:
    """Carve stages out of machines (power-of-two sizes dividing a and k), group into pipelines."""
    cl, mo, tr = problem.cluster, problem.model, problem.training
    groups = []
    for mi in range(len(cl.machines)):
        free = cl.devices_of(mi)
        rng.shuffle(free)
        while free:
            t = rng.choice([x for x in mo.tp_sizes(len(free))])
            groups.append(tuple(free[:t]))
            free = free[t:]
            if rng.random() < 0.2:
                break  # leave some devices idle
    rng.shuffle(groups)
    d = rng.randint(1, max(1, min(len(groups), tr.global_batch // tr.micro_batch, 4)))
    pipes = [groups[i::d] for i in range(d)]
    pipes = [[g for g in p][: mo.layers] for p in pipes if p]
    micro = tr.global_batch // tr.micro_batch
    cuts = sorted(rng.sample(range(1, micro), len(pipes) - 1)) if len(pipes) > 1 else []
    counts = [y - x for x, y in zip([0, *cuts], [*cuts, micro])]
    out = []
    for p, m in zip(pipes, counts):
        cut = sorted(rng.sample(range(1, mo.layers), len(p) - 1)) if len(p) > 1 else []
        layers = [y - x for x, y in zip([0, *cut], [*cut, mo.layers])]
        out.append(Pipeline(batch=m * tr.micro_batch,
                            stages=[Stage(devices=g, layers=n) for g, n in zip(p, layers)]))
    return Plan(pipelines=out)


@pytest.mark.parametrize("seed", range(60))
def test_evaluator_matches_naive_reference(seed):
    rng = random.Random(seed)
    problem = random_problem(rng)
    plan = random_plan(problem, rng)
    est = evaluate(problem, plan)
    ref = reference(problem, plan)
    assert math.isclose(est.iteration_s, ref["T"], rel_tol=1e-9)
    assert math.isclose(est.dp_s, ref["dp"], rel_tol=1e-9, abs_tol=1e-15)
    for pe, want in zip(est.pipelines, ref["pipes"]):
        assert math.isclose(pe.time_s, want, rel_tol=1e-9)
    for st in est.stages:
        assert math.isclose(st.dp_s, ref["stage_dp"][(st.pipeline, st.index)], rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(st.memory_gib * 2**30, ref["memory"][(st.pipeline, st.index)], rel_tol=1e-9)
