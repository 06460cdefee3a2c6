"""The run's timing pieces: the phase timer (nesting, accumulation, the device wait at each
boundary) and the run log's summary of steps (means, medians or the fastest, warm-up left out)."""

from __future__ import annotations

import time

import pytest

from planner.problem import Problem
from runtime.config import RunConfig
from runtime.metrics.runlog import make_run_log, read_run_log, write_run_log
from runtime.metrics.timing import FORWARD, STEP, PhaseTimer
from tests.test_calibration_fit import cluster, plan_of, small_model, small_training


def test_phases_accumulate_and_nest():
    waits = []
    timer = PhaseTimer(synchronize=lambda: waits.append(1))
    with timer.phase(STEP):
        for _ in range(2):
            with timer.phase(FORWARD):
                time.sleep(0.01)
    assert timer.seconds(FORWARD) >= 0.02
    assert timer.seconds(STEP) >= timer.seconds(FORWARD)
    assert timer.seconds("backward") == 0.0
    assert len(waits) == 6  # before and after each of the three phases


def test_run_log_summaries(tmp_path):
    plan = plan_of((8,), [[((0,), 2), ((2,), 2)]])
    problem = Problem(name="p", cluster=cluster(0.5, 4.0, 2.5), model=small_model(), training=small_training())
    step_times = [9.0, 5.0, 1.0, 3.0, 2.0]  # steps 1 and 2 are the warm-up
    steps = [{"step": i + 1, "step_s": t, "wall_s": t + 0.5,
              "stages": [{"pipeline": 0, "stage": k, "forward_s": t * (k + 1), "backward_s": t, "comm_s": 0.1,
                          "sync_s": 0.0, "tp_s": 0.5 * t * k} for k in range(2)]}
             for i, t in enumerate(step_times)]
    path = write_run_log(tmp_path, make_run_log(problem, "c" * 64, plan, RunConfig(model=small_model(), seq_len=128,
                                                                                   micro_batch=2), steps))
    log = read_run_log(path)
    mean, median, fastest = (log.record("x", statistic=s) for s in ("mean", "median", "min"))
    assert mean.step_s == 2.0 and median.step_s == 2.0 and fastest.step_s == 1.0
    assert log.record("x") == mean  # the mean is the default
    micro = 8 // 2
    assert median.stage_s == pytest.approx((2.0 * 2 / micro, 2.0 * 3 / micro))  # (f + b) per micro-batch
    assert mean.tp_s == pytest.approx((0.0, 0.5 * 2.0 / micro))  # TP collectives per micro-batch
    assert mean.tp_stages() == ()  # both stages have TP size 1: no T_tp row to fit
    assert log.record("x", warmup=0).step_s == 4.0 and log.record("x", warmup=0, statistic="median").step_s == 3.0
    assert log.record("x", warmup=1).step_s == 2.75  # (5 + 1 + 3 + 2) / 4
    assert log.run_problem.training.micro_batch == 2 and log.run_problem.model == small_model()


def test_a_sequence_run_log_times_each_replica_by_its_slowest_member(tmp_path):
    from planner.calibration_runs import predicted_rows
    from planner.sequence.plan import Group, Member, Replica, SeqPlan

    plan = SeqPlan(replicas=(  # replica 0: a ring of a pair and one device (2 micro-batches); replica 1: one device
        Replica(batch=4, ring=(Group(members=(Member(device=0, heads=4, tokens=32), Member(device=1, heads=4, tokens=32))),
                               Group(members=(Member(device=2, heads=8, tokens=64),)))),
        Replica(batch=4, ring=(Group(members=(Member(device=3, heads=8, tokens=128),)),))))
    training = small_training().model_copy(update={"global_batch": 8, "token_block": 16})
    problem = Problem(name="p", cluster=cluster(0.5, 4.0, 2.5), model=small_model(), training=training)
    # (replica, group, member, forward, backward, HP all-to-alls, ZeRO-3), seconds in step 1
    members = [(0, 0, 0, 1.0, 2.0, 0.4, 0.6), (0, 0, 1, 1.5, 2.5, 1.8, 0.5), (0, 1, 0, 2.0, 2.0, 0.0, 0.2),
               (1, 0, 0, 3.0, 1.0, 0.0, 0.0)]
    steps = [{"step": i, "step_s": 9.0, "wall_s": 9.5,
              "members": [{"replica": r, "group": g, "member": m, "forward_s": f * i, "backward_s": b * i,
                           "hp_s": hp * i, "zero_s": zero * i} for r, g, m, f, b, hp, zero in members]}
             for i in (1, 2)]
    config = RunConfig(model=small_model(), seq_len=128, micro_batch=2)
    log = read_run_log(write_run_log(tmp_path, make_run_log(problem, "c" * 64, plan, config, steps)))
    record = log.record("x", warmup=1)  # step 2 only: replica 0's slowest member (1.5 + 2.5)·2 over 2 micro-batches
    assert record.stage_s == pytest.approx((4.0, 4.0)) and record.step_s == 9.0
    assert len(predicted_rows(record.problem, record.plan)) == 3  # T_mb of each replica, then T
    # per micro-batch in step 2, from replica 0's busiest member (most time outside its
    # collectives): ZeRO from group 1's lone member (4 − 0.2 = 3.8, against 3 − 1.0 and
    # 4 − 2.3), 0.4/2; HP from the busiest of the pair, member 0 (2.0 against 1.7), 0.8/2.
    # Replica 1 (one device) spent none.
    assert record.hp_s == pytest.approx((0.4, 0.0)) and record.zero_s == pytest.approx((0.2, 0.0))
    assert record.collective_rows() == (("hp", 0), ("zero", 0))
    assert len(predicted_rows(record.problem, record.plan, record.collective_rows())) == 5
    broken = log.model_dump(mode="json")
    broken["steps"][0]["members"] = broken["steps"][0]["members"][:3]
    with pytest.raises(ValueError, match="members that are not the plan's"):
        type(log).model_validate(broken)
