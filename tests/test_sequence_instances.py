"""Bundled long-context instances and the CLI on sequence plans: every longctx problem loads
and has a valid speed-proportional sequence plan; the bundled seqplan validates; validate,
evaluate, instances and schema handle the sequence kind; the evaluator is fast enough for a
solver's inner loop."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import bundled_names, load_plan, load_problem
from planner.kinds import evaluate, validate
from planner.problem import Problem
from planner.sequence import MemberTable, SeqPlan, iteration_time

LONGCTX = [n for n in bundled_names("problems") if n.startswith("longctx-") and n != "longctx-tiny"]


def _even(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def _proportional(weights: list[float], units: int, least: list[int]) -> list[int]:
    """`units` split by weight, each at least least[i] (largest remainder)."""
    extra = units - sum(least)
    exact = [extra * w / sum(weights) for w in weights]
    out = [lo + math.floor(x) for lo, x in zip(least, exact)]
    for i in sorted(range(len(out)), key=lambda i: math.floor(exact[i]) - exact[i])[: units - sum(out)]:
        out[i] += 1
    return out


def speed_plan(problem: Problem, group_size: int = 8) -> SeqPlan:
    """One replica; one group per `group_size` devices of a machine; shards by speed."""
    cluster, model, training = problem.cluster, problem.model, problem.training
    groups = [devs[i:i + group_size] for m in range(len(cluster.machines))
              for devs in [cluster.devices_of(m)] for i in range(0, len(devs), group_size)]
    speed = [float(cluster.machine_flops[cluster.machine_of_device[g[0]]]) * len(g) for g in groups]
    q, per_kv = training.token_block, model.heads // model.num_kv_heads
    units = _proportional(speed, training.seq_len // (2 * q), [math.ceil(len(g) / 2) for g in groups])
    ring = [[(d, per_kv * w, q * v) for d, w, v in zip(g, _even(model.num_kv_heads, len(g)), _even(2 * u, len(g)))]
            for g, u in zip(groups, units)]
    return SeqPlan.from_rings(problem=problem.name, batches=[training.global_batch], rings=[ring])


def test_bundled_longctx_problems():
    assert len(LONGCTX) >= 13
    lengths = {load_problem(n).training.seq_len for n in LONGCTX}
    assert {65536, 131072, 262144, 524288, 1048576} <= lengths
    sizes = {load_problem(n).cluster.num_devices for n in LONGCTX}
    assert {32, 64, 128} <= sizes
    types = max(len({m.gpu for m in load_problem(n).cluster.machines}) for n in LONGCTX)
    assert types == 4


@pytest.mark.parametrize("name", LONGCTX)
def test_each_longctx_problem_has_a_valid_plan(name):
    problem = load_problem(name)
    plan = speed_plan(problem)
    assert validate(problem, plan) == []
    est = evaluate(problem, plan)
    assert math.isfinite(est.iteration_s) and 0 < est.mfu < 1 and est.min_headroom_gib > 0


def test_bundled_seqplan_validates():
    problem, plan = load_problem("longctx-tiny"), load_plan("longctx-tiny")
    assert isinstance(plan, SeqPlan) and plan.problem == "longctx-tiny"
    assert validate(problem, plan) == []
    assert evaluate(problem, plan).iteration_s > 0


def invoke(*args):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_cli_validate_evaluate_instances_schema():
    assert "is valid for longctx-tiny" in invoke("validate", "longctx-tiny", "longctx-tiny")
    out = invoke("evaluate", "longctx-tiny", "longctx-tiny")
    for word in ("members", "groups", "T (iteration)", "max T_rep", "T_dp", "tokens/s", "MFU", "bottleneck"):
        assert word in out
    est = evaluate(load_problem("longctx-tiny"), load_plan("longctx-tiny"))
    assert json.loads(invoke("evaluate", "longctx-tiny", "longctx-tiny", "--json")) == json.loads(est.model_dump_json())
    assert "replicas (" in invoke("evaluate", "longctx-tiny", "longctx-tiny", "--summary")
    listed = invoke("instances")
    assert "longctx-tiny" in listed and "longctx-h100-a100-llama3-8b-1m" in listed
    assert json.loads(invoke("schema", "--type", "seqplan")) == {**SeqPlan.model_json_schema(),
                                                                  "required": ["format", "replicas"]}


def test_solved_views_and_idle_devices():
    from hexiscale.cli.sequence_views import plan_shape, solved_views

    problem, plan = load_problem("longctx-tiny"), load_plan("longctx-tiny")
    est = evaluate(problem, plan)
    assert plan_shape(plan) == "B1: hp2×640→hp1×384 | B1: hp1×1024"
    # every device used: no idle table; longctx-tiny-4 mixes vendors: the bridge table (§8)
    assert len(solved_views(problem, plan, est)) == 2
    one = SeqPlan.from_rings(problem="longctx-tiny", batches=[2], rings=[[[(0, 2, 512), (1, 2, 512)]]])
    assert len(solved_views(problem, one, evaluate(problem, one))) == 3


def _microseconds(problem: Problem, table: MemberTable, repeat: int) -> float:
    iteration_time(problem, table, check=False)
    start = time.perf_counter()
    for _ in range(repeat):
        iteration_time(problem, table, check=False)
    return (time.perf_counter() - start) / repeat * 1e6


def test_iteration_time_is_fast_and_agrees():
    problem = load_problem("longctx-sim-128-llama3-8b-128k")
    plan = speed_plan(problem)
    table = MemberTable.of(plan)
    assert iteration_time(problem, table, check=False) == evaluate(problem, plan).iteration_s
    assert np.isfinite(_microseconds(problem, table, 20))
    assert _microseconds(problem, table, 20) < 20_000  # generous: a 2-core CI machine shared with others
