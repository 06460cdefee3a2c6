"""The simulated pipeline schedule (planner/pipeline_sim.py, docs/cost-model.md §3.3) against
independent judges: its own event-by-event definition, §3.3's closed form where that is exact,
a critical-path lower bound valid for any schedule, and passes worked out by hand.

Where §3.3 is exact in the simulation's model (stage k: forward f_k, backward b_k, τ_k = f_k +
b_k; hop k: send sf_k there and sb_k back, T_pp,k = sf_k + sb_k, each way a link that carries
one transfer at a time):
- m = 1, any pipeline, either schedule: one micro-batch down and back, Σ τ + Σ T_pp.
- S = 1: m·τ.
- 1F1B without sends, the slowest stage last and every stage's forward the same share of its τ
  (as `PipelineTimes.split` prices a plan; uniform pipelines among them): the bound below for
  stage S − 1, Σ_{k<S−1} τ_k + m·τ_{S−1}, is §3.3. Not without the common share: a stage whose
  work is all forward, ahead of one whose work is all backward, holds a gradient back while it
  runs its next forward, and the stage upstream then finishes after the last stage has
  (hypothesis found it: 6.0 against §3.3's 5.0; kept below as a worked case).
- GPipe with every stage's forward the same share α ≤ 1/2 of τ and max T_pp ≤ 2α·max τ:
  its forwards and its backwards are flow lines whose slowest stations are α·max τ and
  (1 − α)·max τ, so T = Σ τ + Σ T_pp + (m − 1)·max τ (planner.pipeline_sim.gpipe_makespan).
Elsewhere 1F1B differs both ways: uneven stages hide part of the fill (§3.3 high), and links
lengthen its cycle, because 1F1B holds at most S − k micro-batches at stage k (§3.3 low).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner.pipeline_rounds as rounds
from planner.layered.cost import pipeline_time
from planner.pipeline_batch import PaddedPipelines, one_f_one_b_makespans
from planner.pipeline_sim import makespan_of, simulate_events, simulated_makespan, simulated_makespans
from planner.pipeline_times import PipelineTimes
from planner.schedules import Pass

SCHEDULES = ("1f1b", "gpipe")
times_ = st.floats(0.0, 4.0, allow_nan=False).map(lambda x: round(x, 3))


@st.composite
def pipelines(draw, max_stages=6, sends=True):
    s = draw(st.integers(1, max_stages))
    hops = st.lists(times_ if sends else st.just(0.0), min_size=s - 1, max_size=s - 1)
    return PipelineTimes(draw(st.lists(times_, min_size=s, max_size=s)), draw(st.lists(times_, min_size=s, max_size=s)),
                         draw(hops), draw(hops))


def closed_form(t: PipelineTimes, m: int) -> float:
    """§3.3 on the same figures: τ_k = f_k + b_k, T_pp,k = sf_k + sb_k."""
    return pipeline_time(t.forward + t.backward, np.append(t.send_forward + t.send_backward, 0.0), m)


def lower_bound(t: PipelineTimes, m: int) -> float:
    """What no schedule beats: one micro-batch down and back; each stage's m passes with the
    first activation's way to it before and the last gradient's way back after; each link's
    m transfers in a row inside one micro-batch's round trip."""
    f, b, sf, sb = t.forward, t.backward, t.send_forward, t.send_backward
    trip = f.sum() + b.sum() + sf.sum() + sb.sum()
    before = np.concatenate([[0.0], np.cumsum(f[:-1] + sf + sb + b[:-1])])
    stages = before + m * (f + b)
    links = trip + (m - 1) * np.concatenate([sf, sb, [0.0]]).max()
    return float(max(trip, stages.max(), links))


def defined(t: PipelineTimes, m: int, schedule: str = "1f1b") -> float:
    return makespan_of(simulate_events(t, m, schedule))


# -- the fast paths equal the definition -------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(pipelines(), st.integers(1, 24), st.sampled_from(SCHEDULES))
def test_simulated_makespan_equals_the_event_by_event_definition(t, m, schedule):
    assert simulated_makespan(t, m, schedule) == pytest.approx(defined(t, m, schedule), rel=1e-12, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(pipelines(max_stages=8), st.integers(1, 40)), min_size=1, max_size=6))
def test_pipelines_run_together_equal_one_at_a_time(cases):
    together = one_f_one_b_makespans(PaddedPipelines.of([t for t, _ in cases], [m for _, m in cases]))
    alone = [simulated_makespan(t, m) for t, m in cases]
    assert together == pytest.approx(alone, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("watch_rounds", [3, 1000])  # 3: A^N ⊗ x takes over; 1000: the periodic jump
def test_the_steady_state_jump_and_matrix_power_equal_running_every_round(monkeypatch, watch_rounds):
    monkeypatch.setattr(rounds, "WATCH_ABOVE", 2)
    monkeypatch.setattr(rounds, "WATCH_ROUNDS", watch_rounds)
    rng = np.random.default_rng(watch_rounds)
    for _ in range(40):
        s, m = int(rng.integers(1, 6)), int(rng.integers(20, 120))
        scale = rng.choice([0.0, 0.3, 2.0])
        t = PipelineTimes(rng.random(s), 2 * rng.random(s), scale * rng.random(s - 1), scale * rng.random(s - 1))
        assert simulated_makespan(t, m) == pytest.approx(defined(t, m), rel=1e-12)


def test_many_micro_batches_cost_what_a_few_do():
    """10^12 micro-batches on a uniform pipeline: (S + m − 1)·τ (exact here, see the note)."""
    t = PipelineTimes([0.5] * 8, [1.0] * 8, [0.0] * 7, [0.0] * 7)
    start = time.perf_counter()
    got = simulated_makespan(t, 10**12)
    assert time.perf_counter() - start < 1.0
    assert got == pytest.approx((8 + 10**12 - 1) * 1.5, rel=1e-12)


def test_many_pipelines_of_many_micro_batches_are_simulated_one_by_one():
    t = [PipelineTimes([1.0, 2.0], [2.0, 4.0], [0.5], [0.5]), PipelineTimes([1.0], [1.0], [], [])]
    got = simulated_makespans(PaddedPipelines.of(t, [500, 3]))
    assert got == pytest.approx([defined(t[0], 500), 6.0])


# -- §3.3 where it is exact, and the bound everywhere ---------------------------------------


@settings(max_examples=200, deadline=None)
@given(pipelines(), st.sampled_from(SCHEDULES))
def test_one_micro_batch_is_the_closed_form(t, schedule):
    assert simulated_makespan(t, 1, schedule) == pytest.approx(closed_form(t, 1), rel=1e-12, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(times_, times_, st.integers(1, 50), st.sampled_from(SCHEDULES))
def test_one_stage_is_m_tau(f, b, m, schedule):
    assert simulated_makespan(PipelineTimes([f], [b], [], []), m, schedule) == pytest.approx(m * (f + b), abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(st.lists(times_, min_size=1, max_size=6), st.floats(0.0, 1.0), st.integers(1, 30), st.floats(0.0, 2.0))
def test_1f1b_without_sends_the_slowest_stage_last_and_one_forward_share_is_the_closed_form(tau, share, m, extra):
    tau = np.array(tau)
    tau[-1] = tau.max() + extra
    t = PipelineTimes.split(tau, np.zeros(len(tau)), share)
    assert simulated_makespan(t, m) == pytest.approx(closed_form(t, m), rel=1e-12, abs=1e-12)


def test_stages_of_different_forward_shares_can_finish_after_the_closed_form():
    """τ = (0, 0, 1, 1, 0, 1), the last stage slowest (tied), m = 3; stage 3 is all forward,
    stage 2 all backward, stage 5 all backward. Stage 3 runs its third forward in [2, 3] while
    the first gradient waits for it, so stage 2's backwards run [3, 4], [4, 5], [5, 6]: T = 6,
    where §3.3 says Σ τ + (m − 1)·max τ = 3 + 2 = 5."""
    t = PipelineTimes([0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 1], [0.0] * 5, [0.0] * 5)
    assert closed_form(t, 3) == 5.0
    assert simulated_makespan(t, 3) == 6.0 == defined(t, 3)


@pytest.mark.parametrize("stages, m", [(1, 7), (2, 2), (4, 9), (8, 64), (16, 3)])
def test_1f1b_on_uniform_pipelines_is_s_plus_m_minus_1_periods(stages, m):
    t = PipelineTimes([1.0] * stages, [2.0] * stages, [0.0] * (stages - 1), [0.0] * (stages - 1))
    assert simulated_makespan(t, m) == (stages + m - 1) * 3.0 == closed_form(t, m)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.1, 4.0), min_size=1, max_size=6), st.floats(0.2, 0.5), st.integers(1, 30),
       st.floats(0.0, 1.0))
def test_gpipe_with_a_common_forward_share_and_links_off_the_path_is_the_closed_form(tau, alpha, m, load):
    tau = np.array(tau)
    pp = np.append(np.full(len(tau) - 1, load * 2 * alpha * tau.max()), 0.0)
    t = PipelineTimes.split(tau, pp, alpha)
    assert simulated_makespan(t, m, "gpipe") == pytest.approx(pipeline_time(tau, pp, m), rel=1e-12)


@settings(max_examples=300, deadline=None)
@given(pipelines(), st.integers(1, 30), st.sampled_from(SCHEDULES))
def test_never_below_the_critical_path_bound(t, m, schedule):
    assert simulated_makespan(t, m, schedule) >= lower_bound(t, m) * (1 - 1e-12) - 1e-12


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 4.0), min_size=1, max_size=7), st.sampled_from([1 / 3, 1 / 4, 1 / 2]),
       st.integers(1, 30))
def test_1f1b_without_sends_never_above_the_closed_form(tau, share, m):
    """With one forward share for all stages (the evaluator's, bar T_tp) and no sends."""
    t = PipelineTimes.split(np.array(tau), np.zeros(len(tau)), share)
    assert simulated_makespan(t, m) <= closed_form(t, m) * (1 + 1e-12) + 1e-12


# -- worked by hand ------------------------------------------------------------------------


def test_uneven_two_stages_by_hand():
    """f = (2, 1), b = (4, 2), no sends, m = 3. Stage 0 runs F0 F1 B0 F2 B1 B2, stage 1 F0 B0
    F1 B1 F2 B2: F0 [0,2] on 0, [2,3] on 1; B0 [3,5] on 1; F1 [2,4] on 0; B0 [5,9] on 0 (its
    gradient at 5); F1 [5,6], B1 [6,8] on 1; F2 [9,11] on 0, [11,12] on 1; B1 [11,15] on 0;
    B2 [12,14] on 1, [15,19] on 0. T = 19, where §3.3 says 9 + 2·6 = 21: stage 1's fill
    (3) is hidden behind stage 0 but for 1."""
    t = PipelineTimes([2, 1], [4, 2], [0], [0])
    spans = simulate_events(t, 3)
    F, B = Pass.forward, Pass.backward
    assert spans[(0, B, 0)] == (5, 9) and spans[(1, F, 2)] == (11, 12) and spans[(0, B, 2)] == (15, 19)
    assert simulated_makespan(t, 3) == 19 and closed_form(t, 3) == 21 and lower_bound(t, 3) == 18


def test_uneven_two_stages_with_sends_by_hand():
    """f = (1, 2), b = (2, 4), one hop of 1 each way, m = 2. F0 [0,1] on 0, sent [1,2]; F1
    [1,2], sent [2,3]; F0 [2,4], B0 [4,8] on 1, sent back [8,9]; F1 [8,10], B1 [10,14] on 1,
    back [14,15]; B0 [9,11], B1 [15,17] on 0. T = 17 = §3.3's 9 + 2 + 6."""
    t = PipelineTimes([1, 2], [2, 4], [1], [1])
    assert simulate_events(t, 2)[(0, Pass.backward, 1)] == (15, 17)
    assert simulated_makespan(t, 2) == 17 == closed_form(t, 2)


def test_links_lengthen_the_1f1b_cycle_by_hand():
    """f = b = 1 on two stages, 0.5 each way, m = 3. Stage 0 runs F0 F1 B0 F2 B1 B2: F0 [0,1],
    F1 [1,2]; stage 1 F0 [1.5,2.5], B0 [2.5,3.5], F1 [3.5,4.5] (arrived at 2.5), B1 [4.5,5.5];
    B0 [4,5] on 0, F2 [5,6], sent [6,6.5]; B1 [6,7]; F2 [6.5,7.5], B2 [7.5,8.5] on 1, back at
    9; B2 [9,10]. T = 10 > §3.3's 4 + 1 + 2·2 = 9: stage 0 holds two micro-batches, so each
    waits out a round trip over the link."""
    t = PipelineTimes([1, 1], [1, 1], [0.5], [0.5])
    assert simulate_events(t, 3)[(0, Pass.forward, 2)] == (5, 6)
    assert simulated_makespan(t, 3) == 10 and closed_form(t, 3) == 9
    assert simulated_makespan(t, 3, "gpipe") == 9  # GPipe holds all three: no such wait


def test_bad_figures_are_refused_in_one_line():
    with pytest.raises(ValueError, match="PipelineTimes.forward"):
        PipelineTimes([-1.0], [1.0], [], [])
    with pytest.raises(ValueError, match="2 stages need"):
        PipelineTimes([1.0, 1.0], [1.0, 1.0], [], [])
    with pytest.raises(ValueError, match="micro_batches"):
        simulated_makespan(PipelineTimes([1.0], [1.0], [], []), 0)
    with pytest.raises(KeyError, match="unknown schedule"):
        simulated_makespan(PipelineTimes([1.0], [1.0], [], []), 1, "zero-bubble")


# -- in the evaluator ------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_evaluate_reports_each_pipelines_simulated_schedule(schedule):
    """Each pipeline's simulated T_pipe is the simulation of its own stages' reported figures
    (forward C/c + 2·T_tp/r, backward the rest of τ, T_pp/2 each way); T with it adds T_dp."""
    from planner import evaluate
    from planner.io import load_plan, load_problem

    problem = load_problem("demo-tiny")
    problem = problem.model_copy(update={"training": problem.training.model_copy(update={"schedule": schedule})})
    estimate = evaluate(problem, load_plan("demo-tiny"))
    c, r = (4, 6) if problem.training.recompute else (3, 4)
    for pipe in estimate.pipelines:
        stages = pipe.stages
        assert [s.forward_s for s in stages] == pytest.approx([s.compute_s / c + 2 * s.tp_s / r for s in stages])
        t = PipelineTimes([s.forward_s for s in stages], [s.tau_s - s.forward_s for s in stages],
                          [s.pp_s / 2 for s in stages[:-1]], [s.pp_s / 2 for s in stages[:-1]])
        assert pipe.simulated_s == pytest.approx(defined(t, pipe.micro_batches, schedule), rel=1e-9)
        assert pipe.simulated_s >= lower_bound(t, pipe.micro_batches) * (1 - 1e-12)
    assert estimate.simulated_s == pytest.approx(max(p.simulated_s for p in estimate.pipelines) + estimate.dp_s)


def test_the_watch_finds_the_least_cycle_and_its_shift():
    """`_periodic_shift` tests every cycle at once: the least c whose state c rounds back, shifted
    by one amount in every entry, is the state now; None where no row is such a shift."""
    a, b = np.array([0.0, 1.0, 5.0]), np.array([0.0, 2.0, 4.0])  # b is no shift of a
    history = [a, b, a + 10.0, b + 10.0]  # period 2, +10 per 2 rounds (and +20 per 4)
    now = a + 20.0
    assert rounds._periodic_shift(history, now) == (2, 10.0)
    assert rounds._periodic_shift(history[:1], now) == (1, 20.0)  # one state back, shifted by 20
    assert rounds._periodic_shift(history, now + np.array([0.0, 0.0, 1e-6])) is None
    assert rounds._periodic_shift([], now) is None
