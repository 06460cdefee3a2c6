"""Which link slowed, measured against the plan's prediction (docs/testbed.md §5; layered plans).

For every stage-to-stage boundary that crosses machines, the cost model prices the exchange of
one step as m · T_pp,k (docs/cost-model.md §3.2: activations forward and gradients back, per
micro-batch, at the pair's bandwidth and latency). A run's step record has each stage's
exchange seconds, waits for the neighbour's compute included; the smaller of the two sides'
is the one least inflated by those waits. A boundary whose measured exchange stays above
`factor` × its prediction from some step to the end is reported with that step, the measured and
predicted seconds and their ratio: the link the plan now misprices.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.kinds import kind_of
from planner.layered.pricing import breakdown
from planner.layered.table import stage_table
from planner.problem import Problem
from runtime.metrics.runlog import after_warmup, run_problem
from runtime.precision import SCHEMES
from runtime.testbed.layout import scaled_cluster

SLOW_FACTOR = 4.0


@dataclass(frozen=True)
class Boundary:
    pipeline: int
    stage: int  # the sending stage (k → k+1)
    sender: str  # machine names
    receiver: str
    predicted_s: float  # one step's exchange, m · T_pp,k


def problem_on_testbed(problem: Problem, job, scale: float) -> Problem:
    """`problem` as the testbed runs `job`: its cluster's inter-machine links × `scale` (the
    shaping), the model and settings the run trained, and the bytes its precision sends (an fp32
    run's activations are 4 bytes, where the problem may price 2)."""
    scheme = SCHEMES[job.config.precision]
    as_run = run_problem(problem.model_copy(update={"cluster": scaled_cluster(problem.cluster, scale)}),
                         job.config.model, job.config)
    training = as_run.training.model_copy(update={"act_bytes": scheme.act_bytes, "grad_bytes": scheme.grad_bytes})
    return Problem.model_validate({**as_run.model_dump(), "training": training.model_dump()})


def crossing_boundaries(problem: Problem, plan) -> list[Boundary]:
    """The plan's stage boundaries between two machines, each with its predicted step exchange."""
    if not kind_of(plan).pipeline_schedule:  # only pipelines have stage boundaries
        return []
    pp = breakdown(problem, stage_table(problem, plan)).pp
    cluster, index, found = problem.cluster, 0, []
    for p, pipe in enumerate(plan.pipelines):
        micro = pipe.batch // problem.training.micro_batch
        machines = [cluster.machines[int(cluster.machine_of_device[st.devices[0]])].name for st in pipe.stages]
        for k in range(len(pipe.stages) - 1):
            if machines[k] != machines[k + 1]:
                found.append(Boundary(p, k, machines[k], machines[k + 1], micro * float(pp[index + k])))
        index += len(pipe.stages)
    return found


def measured_exchange(step: dict, boundary: Boundary) -> float:
    """The smaller of the two sides' exchange seconds in one step record."""
    sides = [st["comm_s"] for st in step.get("stages", ())
             if st["pipeline"] == boundary.pipeline and st["stage"] in (boundary.stage, boundary.stage + 1)]
    return min(sides) if len(sides) == 2 else 0.0


def slowed_links(problem: Problem, plan, steps: list[dict], factor: float = SLOW_FACTOR) -> list[str]:
    """One line per boundary whose exchange stayed above `factor` × its prediction from some step
    to the run's end (see module doc): a lasting slowdown, not one step's stall on shared cores.
    The warm-up steps are left out (their exchanges wait for the ranks' start and connections)."""
    lines, steps = [], list(after_warmup(steps))
    for b in crossing_boundaries(problem, plan):
        measured = [(s["step"], measured_exchange(s, b)) for s in steps]
        slow = []
        for step, seconds in reversed(measured):  # the run's last steps, back to the first fast one
            if seconds <= factor * b.predicted_s:
                break
            slow.insert(0, (step, seconds))
        if slow:
            mean = sum(seconds for _, seconds in slow) / len(slow)
            lines.append(f"link {b.sender} → {b.receiver} (pipeline {b.pipeline}, stage {b.stage} → {b.stage + 1}) "
                         f"slowed from step {slow[0][0]}: its exchange took {mean:.3g} s per step in "
                         f"{len(slow)} step{'s' if len(slow) > 1 else ''} against {b.predicted_s:.3g} s predicted "
                         f"({mean / b.predicted_s:.1f}×)")
    return lines
