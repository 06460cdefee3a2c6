"""Pictures of a plan (matplotlib, PNG), chosen by the plan's kind. A layered plan: the cluster
graph with pipelines and stages, the cost model's pipeline timeline (§3.3 flow line) as a Gantt
chart, and per-device memory against capacity. A sequence plan (§7): its rings (groups, token
shares, heads per member, the mirrored token layout) and per-device time and memory bars."""

from __future__ import annotations

from pathlib import Path

from planner.base import format_seconds
from planner.kinds import evaluate, kind_of
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


def _title(problem: Problem, plan, estimate) -> str:
    solver = f" — {plan.solver.name}" if plan.solver else ""
    return f"{problem.name}{solver}: T = {format_seconds(estimate.iteration_s)}, MFU {estimate.mfu:.1%}"


def _stem(prefix: str) -> str:
    return f"{prefix}-" if prefix and prefix[-1] not in "-_." else prefix  # "cs" → cs-cluster.png


def draw_plan(problem: Problem, plan, out_dir: str | Path, prefix: str = "",
              on_step=lambda what: None) -> list[Path]:
    """Write the plan's pictures into out_dir (PREFIX-NAME.png when a prefix is given):
    cluster.png, schedule.png and memory.png for a layered plan; ring.png and devices.png for
    a sequence plan. Returns the paths written."""
    if kind_of(plan).name == "sequence":
        return draw_sequence_plan(problem, plan, out_dir, prefix, on_step)
    return draw_layered_plan(problem, plan, out_dir, prefix, on_step)


def draw_sequence_plan(problem: Problem, plan, out_dir: str | Path, prefix: str = "",
                       on_step=lambda what: None) -> list[Path]:
    """ring.png (groups, token shares, heads, layout) and devices.png (time and memory bars)."""
    from hexiscale.viz.sequence_bars import draw_bars
    from hexiscale.viz.sequence_ring import draw_ring

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    on_step("pricing the plan")
    estimate = evaluate(problem, plan)
    title = _title(problem, plan, estimate)
    paths = [out / f"{_stem(prefix)}{name}.png" for name in ("ring", "devices")]
    on_step(f"drawing {paths[0].name}")
    draw_ring(problem, plan, paths[0], title)
    on_step(f"drawing {paths[1].name}")
    draw_bars(problem, estimate, paths[1], title)
    return paths


def draw_layered_plan(problem: Problem, plan: Plan, out_dir: str | Path, prefix: str = "",
                      on_step=lambda what: None) -> list[Path]:
    """Write cluster.png, schedule.png and memory.png into out_dir, named PREFIX-cluster.png
    and so on when a prefix is given."""
    from hexiscale.viz.cluster import draw_cluster
    from hexiscale.viz.gantt import draw_gantt
    from hexiscale.viz.memory import draw_memory
    from hexiscale.viz.schedule import pipeline_schedule

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    on_step("pricing the plan")
    estimate = evaluate(problem, plan)
    title = _title(problem, plan, estimate)
    paths = [out / f"{_stem(prefix)}{name}.png" for name in ("cluster", "schedule", "memory")]
    on_step(f"drawing {paths[0].name}")
    draw_cluster(problem, plan, paths[0], title)
    on_step(f"drawing {paths[1].name}")
    schedules = [pipeline_schedule(problem, estimate, p) for p in range(len(plan.pipelines))]
    draw_gantt(schedules, stage_labels(problem, plan), paths[1], title)
    on_step(f"drawing {paths[2].name}")
    draw_memory(problem, estimate, paths[2], title)
    return paths
