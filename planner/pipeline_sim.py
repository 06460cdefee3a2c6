"""One pipeline's schedule simulated event by event (docs/cost-model.md §3.3): its makespan from
the stages' forward and backward times and the hops' send times, reported beside §3.3's closed
form (which stays the objective every solver minimizes).

The model, the runtime's behaviour (`runtime/layered/schedule.py`) in figures:
- stage k runs its passes one at a time, in its schedule's order (`planner.schedules`); a
  forward of micro-batch i waits for its activation from stage k − 1, a backward for its
  gradient from stage k + 1 (the last stage's backward follows its own forward);
- a pass's output is sent as soon as the pass ends (the runtime posts a non-blocking send and
  goes on); it crosses its hop's link in that direction, which carries one transfer at a time
  in the order they were sent and takes the hop's send time for each; the two directions of a
  hop are separate links (a network link is full duplex).

`simulate_events` is the definition: a discrete-event run of any schedule's action lists,
every pass's start and end (its cost grows with S·m). `simulated_makespan` gives the same
makespan for the registered schedules at a cost that does not grow with m: 1F1B round by
round with its steady state jumped over (`planner.pipeline_rounds`), GPipe in closed form.
Tests hold the three to each other, to §3.3 where it is exact, to a critical-path lower bound
and to hand-worked examples (tests/test_pipeline_sim.py).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from planner.pipeline_batch import PaddedPipelines, one_f_one_b_makespans
from planner.pipeline_rounds import one_f_one_b_makespan
from planner.pipeline_times import PipelineTimes
from planner.schedules import Pass, get_schedule


# -- the definition: a discrete-event run of any schedule's action lists --------------------

Span = tuple[float, float]


def simulate_events(times: PipelineTimes, micro_batches: int, schedule: str = "1f1b") -> dict[tuple, Span]:
    """{(stage, Pass, micro-batch): (start, end)} of every pass of the schedule. Raises
    ValueError if the schedule's orders deadlock (a pass waits on one that never runs)."""
    stages, order = times.stages, get_schedule(schedule).actions
    orders = [order(stages, k, micro_batches) for k in range(stages)]
    position, free = [0] * stages, [0.0] * stages
    link = {Pass.forward: [0.0] * (stages - 1), Pass.backward: [0.0] * (stages - 1)}
    arrived: dict[tuple, float] = {}  # (stage, Pass, i) -> when its input is there
    spans: dict[tuple, Span] = {}
    todo = deque(range(stages))
    while todo:
        k = todo.popleft()
        while position[k] < len(orders[k]):
            action = orders[k][position[k]]
            key = (k, action.pass_, action.micro_batch)
            ready = _input_ready(key, stages, arrived, spans)
            if ready is None:
                break
            start = max(free[k], ready)
            end = start + (times.forward[k] if action.pass_ is Pass.forward else times.backward[k])
            spans[key], free[k] = (start, end), end
            position[k] += 1
            sent = _send(times, key, end, link, arrived)
            if sent is not None:
                todo.append(sent)
    if any(p < len(o) for p, o in zip(position, orders)):
        raise ValueError(f"schedule {schedule!r} deadlocks on {stages} stages and {micro_batches} micro-batches")
    return spans


def _input_ready(key: tuple, stages: int, arrived: dict, spans: dict) -> float | None:
    """When the pass `key` may start as far as its input goes (None: not known yet)."""
    k, pass_, i = key
    if pass_ is Pass.forward and k == 0:
        return 0.0
    if pass_ is Pass.backward and k == stages - 1:
        own = spans.get((k, Pass.forward, i))
        return None if own is None else own[1]
    return arrived.get(key)


def _send(times: PipelineTimes, key: tuple, end: float, link: dict, arrived: dict) -> int | None:
    """The output of the pass `key`, ended at `end`, onto its link: the receiving stage, or None."""
    k, pass_, i = key
    if pass_ is Pass.forward and k + 1 < times.stages:
        hop, to, duration = k, k + 1, times.send_forward[k]
    elif pass_ is Pass.backward and k > 0:
        hop, to, duration = k - 1, k - 1, times.send_backward[k - 1]
    else:
        return None
    link[pass_][hop] = max(end, link[pass_][hop]) + duration
    arrived[(to, pass_, i)] = link[pass_][hop]
    return to


def makespan_of(spans: dict[tuple, Span]) -> float:
    return max(end for _, end in spans.values())


# -- the registered schedules' makespans, computed directly ---------------------------------


def gpipe_makespan(times: PipelineTimes, micro_batches: int) -> float:
    """GPipe: every stage runs its m forwards, then its m backwards. Nothing holds a forward
    back but the stage and link before it, so the forwards are a flow line of stations
    (stage 0, link 0, stage 1, …) of fixed times: stage k ends its last forward at
    D_k = Σ p + (m − 1)·max p over the stations up to it (the longest path through the grid
    of stations × micro-batches puts every extra step on the slowest station). The backwards
    are the flow line back (stage S − 1, its link, …, stage 0), entered at stage k' no sooner
    than D_k': T = max_k' D_k' + Σ p + (m − 1)·max p over the stations from k' down to 0."""
    forward_line = np.ravel(np.column_stack([times.forward, np.append(times.send_forward, 0.0)]))[:-1]
    through = np.cumsum(forward_line)[::2] + (micro_batches - 1) * np.maximum.accumulate(forward_line)[::2]
    back_line = np.ravel(np.column_stack([times.backward, np.append(times.send_backward, 0.0)]))[:-1]
    # the stations from stage k' down to stage 0 are the first 2k' + 1 of `back_line`
    rest = np.cumsum(back_line)[::2] + (micro_batches - 1) * np.maximum.accumulate(back_line)[::2]
    return float(np.max(through + rest))


SIMULATORS = {"1f1b": one_f_one_b_makespan, "gpipe": gpipe_makespan}


def simulated_makespan(times: PipelineTimes, micro_batches: int, schedule: str = "1f1b") -> float:
    """The makespan `simulate_events` gives, computed without running every pass (1F1B:
    `planner.pipeline_rounds`; GPipe: its flow-line form)."""
    if micro_batches < 1:
        raise ValueError(f"micro_batches: at least 1, got {micro_batches}")
    get_schedule(schedule)  # an unknown name: the registry's own error
    return SIMULATORS[schedule](times, micro_batches)


BATCH_ROUNDS = 64  # 1F1B pipelines of at most this many micro-batches are run together


def simulated_makespans(pipelines: PaddedPipelines, schedule: str = "1f1b") -> np.ndarray:
    """`simulated_makespan` of many pipelines: under 1F1B those of at most BATCH_ROUNDS
    micro-batches all at once (`planner.pipeline_batch`), the others one by one."""
    get_schedule(schedule)
    if np.any(pipelines.micro_batches < 1):
        raise ValueError(f"micro_batches: at least 1 per pipeline, got {pipelines.micro_batches.tolist()}")
    few = pipelines.micro_batches <= BATCH_ROUNDS if schedule == "1f1b" else np.zeros(len(pipelines.stages), bool)
    out = np.empty(len(pipelines.stages))
    if few.any():
        out[few] = one_f_one_b_makespans(pipelines.subset(few))
    for p in np.flatnonzero(~few):
        out[p] = SIMULATORS[schedule](pipelines.row(int(p)), int(pipelines.micro_batches[p]))
    return out
