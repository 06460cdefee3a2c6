"""Why a layered plan leaves GPUs idle (`solvers.idle`): the plan is re-priced with the
idle devices of one machine added as one more stage (TP group) at every position of every
pipeline, taking 1, 2, … layers from the stages around it, and the best such plan is
reported with its T and its bottleneck. Pipelines are tried slowest first (adding devices
where T is set is what could help) and at most MAX_PLACEMENTS placements per machine are
priced, so that a plan of thousands of stages is explained in seconds; the text says when
the search was cut. This is an explanation, not a search: a solver that
found a better plan this way would have been beaten by a local move it does not try.
"""

from __future__ import annotations

import time
from itertools import islice

from planner.layered.evaluate import find_bottleneck
from planner.layered.plan import Pipeline, Plan, Stage
from planner.layered.pricing import breakdown, iteration_time
from planner.layered.table import stage_table
from planner.layered.validate import validate
from planner.problem import Problem
from solvers.idle import MAX_MACHINES, TIME_BUDGET_S, IdleMachine, idle_devices

MAX_PLACEMENTS = 100  # priced placements per machine: big plans have O(D·S·L) of them
STAGE_BUDGET = 20_000  # placements × stages of the plan per machine: fewer placements on huge plans


def explain_idle(problem: Problem, plan: Plan, deadline: float | None = None) -> list[IdleMachine]:
    """One explanation per machine with idle devices (at most MAX_MACHINES, and none started
    after TIME_BUDGET_S or `deadline` (a `time.perf_counter` instant): a plan of thousands of
    stages costs ~0.1 s per priced placement, and a machine's placements stop at the deadline)."""
    start = time.perf_counter()
    deadline = min(deadline if deadline is not None else float("inf"), start + TIME_BUDGET_S)
    out, order = [], _slowest_first(problem, plan)
    limit = max(3, min(MAX_PLACEMENTS, STAGE_BUDGET // plan.num_stages))
    for m, idle in list(idle_devices(problem, plan).items())[:MAX_MACHINES]:
        if time.perf_counter() > deadline:
            break
        group = idle[: _largest_tp(problem, len(idle))]
        tried = list(islice(_before(deadline, _with_stage(problem, plan, group, order)), limit + 1))
        cut = (f" (best of the first {min(limit, len(tried))} placements tried, slowest pipelines first)"
               if len(tried) > limit or time.perf_counter() > deadline else "")
        best = min(tried[:limit], key=lambda c: iteration_time(problem, c, check=False), default=None)
        name = problem.cluster.machines[m].name
        if best is None:
            out.append(IdleMachine(name, idle, None, "no placement of them as a stage fits in memory" + cut, None))
        else:
            # the bottleneck from the breakdown alone: `evaluate` would also simulate every
            # pipeline's schedule (3 s of a 10^5-GPU plan's, for a line that does not show it)
            priced = breakdown(problem, table := stage_table(problem, best))
            out.append(IdleMachine(name, idle, priced.iteration,
                                   find_bottleneck(problem, table, priced).description + cut, best))
    return out


def _before(deadline: float, items):
    """The items of an iterator until `deadline` passes."""
    for item in items:
        if time.perf_counter() > deadline:
            return
        yield item


def _slowest_first(problem: Problem, plan: Plan) -> list[int]:
    pipe_time = breakdown(problem, stage_table(problem, plan)).pipe_time
    return sorted(range(len(plan.pipelines)), key=lambda p: -pipe_time[p])


def _largest_tp(problem: Problem, available: int) -> int:
    return max(problem.model.tp_sizes(available))


def _with_stage(problem: Problem, plan: Plan, devices: tuple[int, ...], order: list[int]):
    """Every valid plan with `devices` inserted as a stage taking n layers off its neighbours,
    pipeline by pipeline in `order`."""
    for p in order:
        pipe = plan.pipelines[p]
        for k in range(len(pipe.stages) + 1):
            for n in range(1, problem.model.layers):
                layers = _take_layers([s.layers for s in pipe.stages], k, n)
                if layers is None:
                    break
                stages = [s.model_copy(update={"layers": c}) for s, c in zip(pipe.stages, layers)]
                stages.insert(k, Stage(devices=devices, layers=n))
                pipes = list(plan.pipelines)
                pipes[p] = Pipeline(batch=pipe.batch, stages=tuple(stages))
                candidate = Plan(problem=plan.problem, pipelines=tuple(pipes))
                if not validate(problem, candidate):
                    yield candidate


def _take_layers(layers: list[int], k: int, n: int) -> list[int] | None:
    """Take n layers for a stage inserted at position k, one at a time from whichever of its
    neighbours (nearest first) has the most layers left; None when they cannot spare n."""
    out = list(layers)
    near = sorted(range(len(out)), key=lambda i: (abs(i + 0.5 - k), i))
    for _ in range(n):
        donor = max((i for i in near if out[i] > 1), key=lambda i: out[i], default=None)
        if donor is None:
            return None
        out[donor] -= 1
    return out
