"""Pictures of a layered plan (docs/cost-model.md §3): the cluster graph with pipelines and stages, the
cost model's pipeline timeline (§3.3 flow line) as a Gantt chart, and per-device memory
against capacity. `hexiscale.viz.draw_plan` picks this module for a layered plan."""

from __future__ import annotations

from pathlib import Path

from hexiscale.viz.common import prepare
from planner.layered.plan import Plan
from planner.problem import Problem


def stage_labels(problem: Problem, plan: Plan) -> list[list[str]]:
    """Row labels of the Gantt chart: stage, machine, t and layers."""
    cluster = problem.cluster
    return [
        [f"s{k} {cluster.machines[cluster.machine_of_device[st.leader]].name} t{st.tp} n{st.layers}"
         for k, st in enumerate(pipe.stages)]
        for pipe in plan.pipelines
    ]


def draw_plan(problem: Problem, plan: Plan, out_dir: str | Path, prefix: str = "",
              on_step=lambda what: None) -> list[Path]:
    """Write cluster.png, schedule.png and memory.png into out_dir, named PREFIX-cluster.png
    and so on when a prefix is given."""
    from hexiscale.viz.cluster import draw_cluster  # matplotlib only when drawing
    from hexiscale.viz.gantt import MAX_PANELS, draw_gantt
    from hexiscale.viz.memory import draw_memory
    from hexiscale.viz.schedule import pipeline_schedule

    paths, estimate, title = prepare(problem, plan, out_dir, prefix, ("cluster", "schedule", "memory"), on_step)
    on_step(f"drawing {paths[0].name}")
    draw_cluster(problem, plan, paths[0], title)
    on_step(f"drawing {paths[1].name}")
    # the panels' pipelines only: every block of 10^3 pipelines would be 10^7 objects
    schedules = [pipeline_schedule(problem, estimate, p) for p in range(min(MAX_PANELS, len(plan.pipelines)))]
    draw_gantt(schedules, stage_labels(problem, plan), paths[1], title, pipelines=len(plan.pipelines))
    on_step(f"drawing {paths[2].name}")
    draw_memory(problem, estimate, paths[2], title)
    return paths
