"""Brute force prices its plans on stage tables built straight from its keys (`brute.plan_table`),
not on Plan objects: the tables must be the planner's own table of the plan `make_plan` builds,
field by field, and the memory verdicts those of the plan's own memory check, ZeRO-1's D included."""

from __future__ import annotations

import itertools
from dataclasses import fields

import numpy as np

from instances.random_small import random_small
from planner.layered import cost
from planner.layered.pricing import iteration_time, stage_shapes
from planner.layered.table import stage_table
from solvers.layered.exact import brute

PROBLEMS = [random_small(seed, tiny=True) for seed in range(12)] + [random_small(seed) for seed in range(12)]


def test_the_tables_of_the_keys_are_the_plans_tables() -> None:
    compared = 0
    for problem in PROBLEMS:
        for pipes in itertools.islice(brute.enumerate_plans(problem), 150):
            plan = brute.make_plan(problem, pipes)
            ours, theirs = brute.plan_table(problem, pipes), stage_table(problem, plan)
            for f in fields(theirs):
                np.testing.assert_array_equal(getattr(ours, f.name), getattr(theirs, f.name), err_msg=f.name)
            compared += 1
    assert compared >= 1500, compared


def _fits_by_the_plan(problem, pipe, pipelines: int) -> bool:
    """The memory rule on the table of the pipeline's Plan object (what brute force did before)."""
    table = stage_table(problem, brute.make_plan(problem, [pipe]))
    need = cost.stage_memory_bytes(problem.model, problem.training, stage_shapes(problem, table).with_(pipelines=pipelines))
    return bool(np.all(need <= problem.cluster.machine_memory_bytes[table.machine]))


def test_the_memory_verdicts_are_the_plans() -> None:
    verdicts = []
    for problem in PROBLEMS:
        for seq in brute.stage_sequences(problem)[:40]:
            for layers in itertools.islice(brute.compositions(problem.model.layers, len(seq)), 3):
                for micro, d in itertools.product((1, problem.training.micro_batches), (1, 2)):
                    pipe = (seq, layers, micro)
                    verdicts.append(brute.fits_memory(problem, pipe, d))
                    assert verdicts[-1] == _fits_by_the_plan(problem, pipe, d), (problem.name, pipe, d)
    assert 0.1 < np.mean(verdicts) < 0.9, np.mean(verdicts)  # both verdicts are exercised


def test_the_optimum_is_priced_like_the_plan() -> None:
    for problem in PROBLEMS[:12]:
        result = brute.solve(problem)
        if result.plan is not None:
            assert result.objective_s == iteration_time(problem, result.plan)
