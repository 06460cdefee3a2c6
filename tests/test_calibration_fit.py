"""The fits of planner.calibration on synthetic measurements with known η, bw and α: the
measurements are made by the cost model's own terms at the true figures (with a little
seeded noise where a fit must average), and the fit must recover the figures to 1 %."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner import cost
from planner.layered import cost as layered_cost
from planner.layered.cost import StageShape
from planner.base import US
from planner.calibration import CalibrationError, fit_efficiency, fit_link, term_regressors
from planner.calibration_runs import Figure, RunRecord, measured_rows, predicted_rows, refit, scaled_cluster
from planner.hardware import Cluster, GpuType, Machine
from planner.layered.plan import Pipeline, Plan, Stage
from planner.layered.pricing import breakdown
from planner.layered.table import stage_table
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec

SIZES = 2.0 ** np.arange(10, 29)


def link_rows(bw_gbps: float, lat_s: float, noise: float, seed: int = 0):
    """p2p and 4-rank all-reduce times over 2^10..2^28 bytes, with their regressors."""
    rng = np.random.default_rng(seed)
    terms = [lambda bw, lat, x=x: cost.p2p_time(x, bw, lat) for x in SIZES]
    terms += [lambda bw, lat, x=x: cost.allreduce_time(4, x, bw, lat) for x in SIZES]
    inv_bw, lat = np.array([term_regressors(t) for t in terms]).T
    truth = np.array([t(bw_gbps, lat_s) for t in terms])
    return inv_bw, lat, truth * (1.0 + noise * rng.standard_normal(len(truth)))


def test_regressors_are_the_terms_coefficients():
    inv_bw, lat = term_regressors(lambda bw, a: cost.allreduce_time(4, 8e9, bw, a))
    assert inv_bw == pytest.approx(2 * 3 / 4 * 8.0)  # 2(n−1)/n · x / 1e9, by hand
    assert lat == pytest.approx(6.0)  # 2(n−1)


def test_link_fit_recovers_bandwidth_and_latency():
    fit = fit_link(*link_rows(3.7, 42 * US, noise=0.003))
    assert fit.bw_gbps == pytest.approx(3.7, rel=0.01)
    assert fit.latency_us == pytest.approx(42, rel=0.01)
    assert fit.points == 2 * len(SIZES)


@settings(max_examples=10, deadline=None)
@given(bw=st.floats(0.05, 400), lat_us=st.floats(0.5, 500))
def test_link_fit_exact_on_noiseless_points(bw, lat_us):
    fit = fit_link(*link_rows(bw, lat_us * US, noise=0.0))
    assert fit.bw_gbps == pytest.approx(bw, rel=1e-6)
    assert fit.latency_us == pytest.approx(lat_us, rel=1e-6)


def test_weighted_link_fit_trusts_the_repeatable_measurements():
    """Small messages scattered by 20 %, large ones by 2 % (as gloo's are): weighting each row
    by its standard error — the least-squares estimator of least variance for such noise —
    recovers the bandwidth several times closer than weighting every row alike."""
    inv_bw, lat, truth = link_rows(0.9, 1300 * US, noise=0.0)
    relative_error = np.where(np.concatenate([SIZES, SIZES]) < 2**20, 0.20, 0.02)
    weighted, plain = [], []
    for seed in range(30):
        measured = truth * (1 + relative_error * np.random.default_rng(seed).standard_normal(len(truth)))
        weighted.append(abs(fit_link(inv_bw, lat, measured, sigma=relative_error * truth).bw_gbps / 0.9 - 1))
        plain.append(abs(fit_link(inv_bw, lat, measured).bw_gbps / 0.9 - 1))
    assert np.mean(weighted) < 0.01 and max(weighted) < 0.025
    assert np.mean(weighted) < np.mean(plain) / 2


def test_link_fit_refuses_a_bandwidth_its_messages_do_not_determine():
    """1–64 KiB over a 1 GB/s link with α = 1 ms, times scattered by 5 %: the largest p2p
    transfer (66 µs) is about the scatter of its time (53 µs). Here the fit lands at 1.94 GB/s
    with a standard error (from the residuals) of ±159 %: refused, where a bandwidth the
    times do not support would otherwise be written. With messages up to 256 MiB the same
    noise determines it."""
    inv_bw, lat, measured = link_rows(1.0, 1000 * US, noise=0.05, seed=4)
    small = np.concatenate([SIZES, SIZES]) <= 2**16
    with pytest.raises(CalibrationError, match=r"standard error of ±\d+% .*cannot determine it"):
        fit_link(inv_bw[small], lat[small], measured[small], "small messages")
    assert fit_link(inv_bw, lat, measured).bw_gbps == pytest.approx(1.0, rel=0.05)


def test_weighted_link_fit_exact_on_noiseless_points():
    inv_bw, lat, truth = link_rows(2.5, 80 * US, noise=0.0)
    sigma = truth * np.random.default_rng(3).uniform(0.001, 0.3, len(truth))
    fit = fit_link(inv_bw, lat, truth, sigma=sigma)
    assert fit.bw_gbps == pytest.approx(2.5, rel=1e-6)
    assert fit.latency_us == pytest.approx(80, rel=1e-6)


def test_efficiency_fit_recovers_eta():
    model, training = small_model(), small_training()
    ideal = np.array([layered_cost.stage_compute_time(model, training, StageShape(tp=t, layers=n, last=last, flops=2e12, attention_flops=2e12))
                      for t in (1, 2, 4) for n in (1, 2, 3) for last in (0, 1)])
    noisy = ideal / 0.37 * (1 + 0.003 * np.random.default_rng(1).standard_normal(len(ideal)))
    assert fit_efficiency(ideal, noisy) == pytest.approx(0.37, rel=0.01)


def test_a_negative_intercept_is_refitted_at_zero_latency():
    """x/bw − 0.2 µs: positive times whose free fit puts α below 0. The least-squares optimum
    under α ≥ 0 lies at α = 0, and its bandwidth is the fit through the origin: here the
    relative residuals' one-column least squares, computed directly."""
    inv_bw, lat, _ = link_rows(2.0, 10 * US, noise=0.0)
    p2p = slice(0, len(SIZES))
    times = inv_bw[p2p] / 2.0 - 0.2 * US * lat[p2p]
    fit = fit_link(inv_bw[p2p], lat[p2p], times)
    ratio = inv_bw[p2p] / times  # min Σ (c·ratio − 1)²: c = Σ ratio / Σ ratio²
    assert fit.latency_at_zero and fit.latency_us == 0.0
    assert 1.0 / fit.bw_gbps == pytest.approx(ratio.sum() / (ratio ** 2).sum(), rel=1e-9)
    clean = fit_link(inv_bw[p2p], lat[p2p], inv_bw[p2p] / 2.0 + 10 * US * lat[p2p])
    assert not clean.latency_at_zero and clean.latency_us == pytest.approx(10.0, rel=1e-6)


def test_refusals():
    inv_bw, lat, times = link_rows(2.0, 10 * US, noise=0.0)
    with pytest.raises(CalibrationError, match="one message size"):
        fit_link(inv_bw[:1], lat[:1], times[:1])
    p2p = slice(0, len(SIZES))
    with pytest.raises(CalibrationError, match="not positive"):
        fit_link(inv_bw[p2p], lat[p2p], 1e-3 * (1.0 - inv_bw[p2p]))  # longer messages faster
    with pytest.raises(CalibrationError, match=r"outside \(0, 1\]"):
        fit_efficiency([1.0, 2.0], [0.5, 1.0])
    with pytest.raises(CalibrationError, match="cannot determine"):
        fit_efficiency(np.zeros((0,)), np.zeros((0,)))


# -- refitting a cluster from run records ---------------------------------------------------

def small_model() -> ModelSpec:
    return ModelSpec(name="small", layers=4, hidden=256, heads=8, kv_heads=4, ffn_hidden=704, vocab=512)


def small_training(recompute: bool = False) -> TrainingSpec:
    return TrainingSpec(seq_len=128, global_batch=8, micro_batch=2, recompute=recompute, act_bytes=4, grad_bytes=4)


def cluster(eta: float, intra_bw: float, inter_bw: float, intra_lat: float = 40, inter_lat: float = 60) -> Cluster:
    return Cluster(name="synthetic", gpu_types=(GpuType(name="cpu", peak_tflops=0.05, memory_gib=8, efficiency=eta),),
                   machines=tuple(Machine(name=f"m{i}", gpu="cpu", count=2, intra_bw_gbps=intra_bw)
                                  for i in range(2)),
                   inter_bw_gbps=inter_bw, intra_latency_us=intra_lat, inter_latency_us=inter_lat)


PLANS = [  # (batches, stages as (devices, layers)) on 2 machines × 2 devices
    ((8,), [[((0, 1), 4)]]),
    ((8,), [[((0,), 2), ((2,), 2)]]),
    ((8,), [[((0, 1), 3), ((2, 3), 1)]]),
    ((4, 4), [[((0,), 4)], [((2,), 4)]]),
    ((4, 4), [[((0,), 1), ((1,), 3)], [((2, 3), 4)]]),
    ((6, 2), [[((0, 1), 2), ((2,), 2)], [((3,), 4)]]),
]


def plan_of(batches, stages) -> Plan:
    return Plan(pipelines=tuple(Pipeline(batch=b, stages=tuple(Stage(devices=d, layers=n) for d, n in pipe))
                                for b, pipe in zip(batches, stages)))


def synthetic_records(truth: Cluster, believed: Cluster, plans=PLANS, *, tp_times: bool = False,
                      unpriced_tp_compute: float = 0.0) -> list[RunRecord]:
    """Records of `plans` timed at the `truth` figures by the cost model, each with and without
    recompute; `tp_times`: with each stage's T_tp as the communicator records it;
    `unpriced_tp_compute`: every TP stage computes that fraction longer than C (the fixed
    per-operation work a TP rank does not share, which the cost model does not price)."""
    records = []
    for i, (batches, stages) in enumerate(plans):
        plan = plan_of(batches, stages)
        for recompute in (False, True):
            run = Problem(name="p", cluster=truth, model=small_model(), training=small_training(recompute))
            rows, parts = predicted_rows(run, plan), breakdown(run, stage_table(run, plan))
            extra = unpriced_tp_compute * parts.compute * (stage_table(run, plan).tp > 1)
            micro = [p.batch // run.training.micro_batch for p in plan.pipelines for _ in p.stages]
            records.append(RunRecord(problem=run.model_copy(update={"cluster": believed}), plan=plan,
                                     stage_s=tuple(rows[:-1] + extra), step_s=float(rows[-1] + max(extra * micro)),
                                     source=f"run{i}", tp_s=tuple(parts.tp) if tp_times else ()))
    return records


def test_refit_recovers_eta_bandwidths_and_latencies_from_runs():
    truth, believed = cluster(0.37, 1.9, 0.6, 700, 900), cluster(0.5, 4.0, 2.5)
    records = synthetic_records(truth, believed)
    # as read from separate logs: equal clusters, distinct objects, already priced once
    records = [replace(r, problem=r.problem.model_copy(update={"cluster": cluster(0.5, 4.0, 2.5)})) for r in records]
    for r in records:
        predicted_rows(r.problem, r.plan)
    with pytest.raises(CalibrationError, match="another cluster"):
        refit(records + [replace(records[0], problem=records[0].problem.model_copy(
            update={"cluster": cluster(0.5, 4.0, 2.0)}), source="moved")])
    fitted, figures = refit(records)
    assert fitted.catalog["cpu"].efficiency == pytest.approx(0.37, rel=0.01)
    assert fitted.machine_intra_bw == pytest.approx([1.9, 1.9], rel=0.01)
    assert fitted.inter_bw_gbps == pytest.approx(0.6, rel=0.01)
    assert fitted.intra_latency_us == pytest.approx(700, rel=0.01)
    assert fitted.inter_latency_us == pytest.approx(900, rel=0.01)
    assert {(f.kind, f.name) for f in figures if f.exercised} == {
        ("efficiency", "cpu"), ("bandwidth", "intra"), ("bandwidth", "inter"), ("latency", "intra"),
        ("latency", "inter")}


def test_recorded_tp_times_are_rows_of_their_own():
    truth, believed = cluster(0.37, 1.9, 0.6, 700, 900), cluster(0.5, 4.0, 2.5)
    records = synthetic_records(truth, believed, tp_times=True)
    tp_sizes = [[s.tp for p in r.plan.pipelines for s in p.stages] for r in records]
    for r, sizes in zip(records, tp_sizes):
        assert r.tp_stages() == tuple(i for i, t in enumerate(sizes) if t > 1)
        assert len(measured_rows(r)) == len(r.stage_s) + 1 + sizes.count(2)
    fitted, _ = refit(records, collective_times=True)
    assert fitted.catalog["cpu"].efficiency == pytest.approx(0.37, rel=0.01)
    assert fitted.intra_latency_us == pytest.approx(700, rel=0.01)
    assert fitted.machine_intra_bw == pytest.approx([1.9, 1.9], rel=0.01)


def test_recorded_tp_times_keep_unpriced_compute_out_of_the_link_latency():
    """TP stages computing 25 % longer than the cost model's C: from τ and T alone (the
    default) the fit puts that time on the intra-machine latency (the TP term's own figure,
    > 2× off); fitting the TP collectives timed apart, the latency stays within 10 % and η
    takes the rest."""
    truth, believed = cluster(0.37, 1.9, 0.6, 700, 900), cluster(0.5, 4.0, 2.5)
    one_machine = [PLANS[0], ((4, 4), [[((0,), 4)], [((1,), 4)]])]  # TP, then DP: two message sizes
    records = synthetic_records(truth, believed, one_machine, tp_times=True, unpriced_tp_compute=0.25)
    fits = {timed: refit(records, keep_undetermined=True, collective_times=timed)[0] for timed in (False, True)}
    assert fits[False].intra_latency_us > 2 * 700
    assert fits[True].intra_latency_us == pytest.approx(700, rel=0.10)
    assert fits[True].catalog["cpu"].efficiency < 0.37  # the unpriced compute, as a lower η


def sequence_records(truth: Cluster, believed: Cluster, *, collective_times: bool) -> list[RunRecord]:
    """One sequence plan (an uneven Ulysses pair on machine 0, heads 6 + 2, tokens 96 + 32)
    timed at the `truth` figures by the cost model, with and without recompute;
    `collective_times`: with the replica's HP and ZeRO-3 parts of T_mb as the run log records them."""
    from planner.sequence.plan import Group, Member, Replica, SeqPlan
    from planner.sequence.pricing import time_parts
    from planner.sequence.table import MemberTable

    plan = SeqPlan(replicas=(Replica(batch=8, ring=(Group(members=(
        Member(device=0, heads=6, tokens=96), Member(device=1, heads=2, tokens=32))),)),))
    records = []
    for recompute in (False, True):
        training = small_training(recompute).model_copy(update={"token_block": 16})
        run = Problem(name="p", cluster=truth, model=small_model(), training=training)
        parts = time_parts(run, MemberTable.of(plan))
        records.append(RunRecord(problem=run.model_copy(update={"cluster": believed}), plan=plan,
                                 stage_s=tuple(parts.micro_batch), step_s=parts.iteration, source=f"seq{recompute}",
                                 hp_s=tuple(parts.hp_micro) if collective_times else (),
                                 zero_s=tuple(parts.zero_micro) if collective_times else ()))
    return records


def test_a_sequence_runs_collective_times_determine_its_links():
    """From T_mb and T alone a sequence plan on one machine cannot tell the intra links'
    bandwidth from their latency (compute, all-to-alls and ZeRO-3 move together); its HP and
    ZeRO-3 times, rows of their own, pin both, and η with them."""
    truth, believed = cluster(0.37, 1.9, 0.6, 700, 900), cluster(0.5, 4.0, 2.5)
    with pytest.raises(CalibrationError, match="intra links"):
        refit(sequence_records(truth, believed, collective_times=True))  # recorded, but not asked for
    records = sequence_records(truth, believed, collective_times=True)
    assert [r.collective_rows() for r in records] == [(("hp", 0), ("zero", 0))] * 2
    fitted, figures = refit(records, collective_times=True)
    assert fitted.catalog["cpu"].efficiency == pytest.approx(0.37, rel=0.01)
    assert fitted.machine_intra_bw[0] == pytest.approx(1.9, rel=0.01)
    assert fitted.intra_latency_us == pytest.approx(700, rel=0.01)
    assert {(f.kind, f.name) for f in figures if f.exercised} == {
        ("efficiency", "cpu"), ("bandwidth", "intra"), ("latency", "intra")}


def test_refit_keeps_figures_no_run_exercises():
    truth, believed = cluster(0.37, 1.9, 0.6), cluster(0.5, 4.0, 2.5)
    inside_one_machine = [PLANS[0], ((4, 4), [[((0,), 4)], [((1,), 4)]])]  # TP, then DP: two message sizes
    fitted, figures = refit(synthetic_records(truth, believed, inside_one_machine))
    assert fitted.inter_bw_gbps == believed.inter_bw_gbps
    assert fitted.inter_latency_us == believed.inter_latency_us
    assert not any(f.exercised for f in figures if f.name == "inter")
    with pytest.raises(CalibrationError, match="cannot tell"):  # one message size: bw and α inseparable
        refit(synthetic_records(truth, believed, PLANS[:1]))


def test_refit_can_keep_what_the_runs_do_not_determine():
    truth, believed = cluster(0.37, 1.9, 0.6), cluster(0.5, 4.0, 2.5)
    records = synthetic_records(truth, believed, PLANS[:1])  # TP on one machine: one message size
    fitted, figures = refit(records, keep_undetermined=True)
    kept = [f for f in figures if f.kept_why]
    assert len(kept) == 1 and (kept[0].kind, kept[0].name) in {("bandwidth", "intra"), ("latency", "intra")}
    assert kept[0].after == pytest.approx(kept[0].before) and "cannot tell" in kept[0].kept_why
    # the rest absorbs it: the records' times are reproduced
    for r in records:
        assert predicted_rows(r.problem.model_copy(update={"cluster": fitted}), r.plan) == pytest.approx(
            [*r.stage_s, r.step_s], rel=0.01)
    assert fitted.catalog["cpu"].efficiency == pytest.approx(0.37, rel=0.01)


def test_refit_refuses_eta_above_one():
    truth, believed = cluster(1.0, 4.0, 2.5), cluster(0.5, 4.0, 2.5)
    fast = [RunRecord(problem=r.problem, plan=r.plan, stage_s=tuple(np.array(r.stage_s) / 3),
                      step_s=r.step_s / 3, source=r.source) for r in synthetic_records(truth, believed)]
    with pytest.raises(CalibrationError, match="efficiency"):
        refit(fast)


def test_scaled_cluster_moves_only_the_named_figures():
    base = cluster(0.5, 4.0, 2.5)
    scaled = scaled_cluster(base, {"cpu": 2.0}, {"inter": 4.0}, {"intra": 3.0})
    assert scaled.catalog["cpu"].efficiency == 0.25
    assert scaled.inter_bw_gbps == 0.625 and list(scaled.machine_intra_bw) == [4.0, 4.0]
    assert scaled.intra_latency_us == 120 and scaled.inter_latency_us == 60


def test_a_fit_with_relative_errors_is_exact_on_noiseless_points():
    inv_bw, lat, truth = link_rows(2.5, 80 * US, noise=0.0)
    relative = np.random.default_rng(5).uniform(0.01, 0.3, len(truth))
    fit = fit_link(inv_bw, lat, truth, relative_error=relative)
    assert fit.bw_gbps == pytest.approx(2.5, rel=1e-6) and fit.latency_us == pytest.approx(80, rel=1e-6)


def test_the_links_note_names_the_traffic_the_links_were_refitted_from():
    """Sequence runs alone: layered plans keep `profile --for layered`'s links; both kinds
    together: one figure for two kinds of traffic, said."""
    from hexiscale.cli.calibrate import links_note

    truth, believed = cluster(0.3, 1.5, 0.5), cluster(0.5, 4.0, 2.5)
    moved = [Figure("bandwidth", "inter", 2.5, 0.5, True)]
    sequence = sequence_records(truth, believed, collective_times=False)
    layered = synthetic_records(truth, believed)
    assert "refitted from sequence runs (their all-to-alls and ZeRO-3 collectives): for layered plans, keep the " \
           "links of a cluster from `hexiscale profile --for layered`" in links_note(sequence, moved)
    assert "from layered and sequence runs together" in links_note(sequence + layered, moved)
