"""Terminal views of layered plans (docs/plan-space.md §2 and §4, docs/cost-model.md §3) and their estimates: the per-stage table,
the iteration summary, the solved plan, and a run of one (its per-stage summary, the units its
run record times). Each plan kind has a module like this one; `hexiscale.cli.views` picks it
by the plan's kind."""

from __future__ import annotations

from rich import box
from rich.table import Table

from hexiscale.cli.plan_summary import composition, composition_words, device_use_table, is_large, plural, shape_table
from hexiscale.cli.price_views import price_rows
from hexiscale.cli.run_steps import AFTER_WARMUP, final_steps, mean_over_steps
from hexiscale.cli.vendor_views import bridge_table
from hexiscale.cli.views import plain
from planner.base import GIB, format_runs, format_seconds
from planner.layered.bridge import layered_bridge_traffic
from planner.layered.evaluate import evaluate
from planner.layered.estimate import Estimate
from planner.layered.plan import Plan
from planner.problem import Problem
from hexiscale.cli.idle_views import explained_idle
from solvers.layered.idle import explain_idle


def time_unit(values) -> tuple[str, float]:
    """One unit for a whole column set, so that numbers line up: (name, divisor)."""
    top = max(values, default=0.0)
    return ("s", 1.0) if top >= 1 else ("ms", 1e-3) if top >= 1e-3 else ("µs", 1e-6)


def stage_table_view(est: Estimate) -> Table:
    unit, div = time_unit([x for s in est.stages for x in (s.tau_s, s.pp_s, s.dp_s)])
    table = Table(title=f"stages (p.k = pipeline.stage; C, T_tp, τ, T_pp per micro-batch, dp per "
                        f"iteration, in {unit}; memory GiB per device)",
                  header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    for col in ("p.k", "machine", "devices", "t", "layers", "C", "T_tp", "τ", "T_pp", "dp",
                "mem/cap", "free"):
        table.add_column(col, justify="left" if col in ("machine", "devices", "layers") else "right",
                         no_wrap=col != "devices")
    for s in est.stages:
        free = f"[red]{s.headroom_gib:.1f}[/]" if s.headroom_gib < 0 else f"{s.headroom_gib:.1f}"
        table.add_row(
            f"{s.pipeline}.{s.index}", plain(s.machine), format_runs(s.devices), str(s.tp),
            f"{s.first_layer}-{s.first_layer + s.layers - 1}",
            *(f"{x / div:.3g}" for x in (s.compute_s, s.tp_s, s.tau_s, s.pp_s, s.dp_s)),
            f"{s.memory_gib:.1f}/{s.capacity_gib:.0f}", free,
        )
    return table


def summary_view(problem: Problem, est: Estimate) -> Table:
    table = Table(title="iteration", show_header=False, box=box.SIMPLE)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    slowest = max(est.pipelines, key=lambda p: p.time_s)
    table.add_row("T (iteration)", format_seconds(est.iteration_s))
    table.add_row("max T_pipe", f"{format_seconds(est.pipe_s)}  (pipeline {slowest.index})")
    table.add_row("T_dp", format_seconds(est.dp_s))
    table.add_row("T simulated", f"{format_seconds(est.simulated_s)}  ({problem.training.schedule} pass by pass; "
                                 f"not the objective)")
    for p in est.pipelines:
        table.add_row(f"  pipeline {p.index}", f"B_p={p.batch}, m={p.micro_batches}: "
                      f"{format_seconds(p.time_s)} (bubble {format_seconds(p.bubble_s)}; "
                      f"simulated {format_seconds(p.simulated_s)})")
    table.add_row("tokens/s", f"{est.tokens_per_s:,.0f}")
    table.add_row("MFU", f"{est.mfu:.1%}")
    for label, text in price_rows(problem, [d for s in est.stages for d in s.devices], est):
        table.add_row(label, text)
    table.add_row("min headroom", f"{est.min_headroom_gib:.2f} GiB")
    table.add_row("bottleneck", f"{est.bottleneck.kind}: {plain(est.bottleneck.description)}")
    return table


def plan_table(problem: Problem, plan: Plan, estimate: Estimate) -> Table:
    unit, div = time_unit([s.tau_s for s in estimate.stages])  # µs on tiny problems, never "0.00 ms"
    table = Table(title=f"plan for {plain(problem.name)}", box=box.SIMPLE_HEAVY)
    for col in ("pipe", "batch", "stage", "machine", "devices", "TP", "layers", f"τ {unit}", "mem GiB"):
        table.add_column(col, justify="right" if col not in ("machine", "devices") else "left")
    for pipe, pe in zip(plan.pipelines, estimate.pipelines):
        for k, st in enumerate(pe.stages):
            first = k == 0
            table.add_row(str(pe.index) if first else "", str(pipe.batch) if first else "", str(k),
                          plain(st.machine), format_runs(st.devices), str(st.tp),
                          f"{st.first_layer}–{st.first_layer + st.layers - 1}",
                          f"{st.tau_s / div:.4g}", f"{st.memory_gib:.1f}/{st.capacity_gib:.0f}")
    return table


def plan_shape(plan: Plan) -> str:
    """One line: each pipeline's stages as tp{t}×{layers}."""
    return " | ".join("→".join(f"tp{s.tp}×{s.layers}" for s in p.stages) for p in plan.pipelines)


def pipeline_shapes_view(problem: Problem, plan: Plan, est: Estimate) -> Table:
    """The plan's pipelines grouped by what their stages are (GPU type and TP size, counted)."""
    cluster, units = problem.cluster, []
    for pipe, pe in zip(plan.pipelines, est.pipelines):
        parts = composition([f"{cluster.machines[int(cluster.machine_of_device[st.devices[0]])].gpu} tp{st.tp}"
                             for st in pipe.stages])
        words = f"{plural(len(pipe.stages), 'stage')}: {composition_words(parts)}"
        units.append((parts, words, pe.time_s, pipe.batch))
    return shape_table(f"{plural(len(plan.pipelines), 'pipeline')} of {plural(plan.num_stages, 'stage')}, "
                       f"grouped by their stages (--full: every stage)", ("batch", "T_pipe", "stages"), units)


SUMMARY_ABOVE_STAGES = 64  # larger plans get one row per pipeline unless --full is asked


def pipeline_table_view(est: Estimate) -> Table:
    """One row per pipeline: what a plan of thousands of stages can be read as."""
    unit, div = time_unit([p.time_s for p in est.pipelines])
    table = Table(title=f"pipelines (T_pipe and bubble in {unit}; the slowest stage per pipeline)",
                  header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("p", "batch", "m", "stages", "devices", "T_pipe", "bubble", "slowest stage", "min free GiB"):
        table.add_column(col, justify="left" if col == "slowest stage" else "right")
    for p in est.pipelines:
        slow = max(p.stages, key=lambda s: max(s.tau_s, s.pp_s))
        table.add_row(str(p.index), str(p.batch), str(p.micro_batches), str(len(p.stages)),
                      str(sum(s.tp for s in p.stages)), f"{p.time_s / div:.4g}", f"{p.bubble_s / div:.4g}",
                      f"{slow.index} on {plain(slow.machine)} (t={slow.tp}, {plural(slow.layers, 'layer')})",
                      f"{min(s.headroom_gib for s in p.stages):.1f}")
    return table


def estimate_views(problem: Problem, est: Estimate, full: bool | None = None) -> list[Table]:
    """What `hexiscale evaluate` prints for a layered plan: every stage, or (by default above
    SUMMARY_ABOVE_STAGES stages) one row per pipeline."""
    if full is None:
        full = len(est.stages) <= SUMMARY_ABOVE_STAGES
    return [stage_table_view(est) if full else pipeline_table_view(est), summary_view(problem, est)]


def idle_view(problem: Problem, plan: Plan, est: Estimate, deadline: float | None = None) -> Table | None:
    """Why devices stay idle (`explain_idle` of this kind), or None when none are."""
    return explained_idle(problem, plan, est, explain_idle, deadline)


def bridge_view(problem: Problem, plan: Plan, est: Estimate) -> Table | None:
    """On a cluster that mixes nvidia and amd: what of T and which bytes cross the bridge."""
    if not problem.cluster.mixes_vendors:
        return None
    return bridge_table(problem, layered_bridge_traffic(problem, plan))


def solved_views(problem: Problem, plan: Plan, est: Estimate, *, full: bool = False,
                 deadline: float | None = None) -> list[Table]:
    """What `hexiscale solve` prints before the solver's status: the plan (every stage, or above
    SUMMARY_ABOVE_UNITS pipelines or SUMMARY_ABOVE_PARTS stages unless `full`, its pipelines
    by shape and its devices per GPU type), why devices idle (until `deadline`), and the
    cross-vendor traffic on a mixed-vendor cluster."""
    if full or not is_large(len(plan.pipelines), plan.num_stages):
        head = [plan_table(problem, plan, est)]
    else:
        head = [pipeline_shapes_view(problem, plan, est), device_use_table(problem, plan.devices)]
    extra = [idle_view(problem, plan, est, deadline), bridge_view(problem, plan, est)]
    return head + [view for view in extra if view is not None]


# -- a run of the plan ----------------------------------------------------------------------

PREDICTION_TITLE = ("predicted (cost model) against measured: stage τ per micro-batch (forward + backward), step T "
                    "(schedule + gradient sync)")


def simulated_step(problem: Problem, plan: Plan) -> tuple[str, float]:
    """The prediction table's extra row: T with the pipeline schedule simulated pass by pass
    (docs/cost-model.md §3.3), against the same measured step."""
    return "step, schedule simulated", evaluate(problem, plan).simulated_s


def timed_units(plan: Plan) -> list[tuple[str, str, str]]:
    """(unit, devices, shape) of each unit a run record times: every stage (p pipeline, s stage)."""
    return [(f"p{p} s{k}", ",".join(map(str, stage.devices)), f"{plural(stage.layers, 'layer')}, TP {stage.tp}")
            for p, pipe in enumerate(plan.pipelines) for k, stage in enumerate(pipe.stages)]


def memory_table(problem: Problem, plan: Plan, steps: list[dict]) -> Table | None:
    """Per stage, the GPU allocator's peak over a step (the largest after the warm-up, of the
    stage's ranks) against §3.5's W_σ + Act_σ for `problem` as run (R apart: the CUDA context
    and NCCL's buffers are outside the allocator); None for a run that measured none (CPU)."""
    steps = final_steps(steps, lambda step: len(step["stages"]))
    if not steps or any("peak_mib" not in stage for stage in steps[-1]["stages"]):
        return None
    priced = {(p.index, k): stage for p in evaluate(problem, plan).pipelines for k, stage in enumerate(p.stages)}
    table = Table(title="GPU memory per device: the allocator's peak over a step (largest after the warm-up) "
                        "against docs/cost-model.md §3.5's W_σ + Act_σ")
    for column in ("pipeline", "stage", "peak GiB", "W GiB", "Act GiB", "W+Act GiB", "ratio", "of GiB"):
        table.add_column(column, justify="right")
    for index, record in enumerate(steps[-1]["stages"]):
        measured = max(step["stages"][index]["peak_mib"] for step in steps) * 2**20 / GIB
        stage = priced[(record["pipeline"], record["stage"])]
        both = stage.states_gib + stage.activations_gib
        table.add_row(str(record["pipeline"]), str(record["stage"]),
                      f"{measured:.2f}", f"{stage.states_gib:.2f}", f"{stage.activations_gib:.2f}", f"{both:.2f}",
                      f"{measured / both:.3f}", f"{stage.capacity_gib:.0f}")
    return table


def run_table(result, plan: Plan) -> Table:
    """Per-stage mean forward/backward time over the steps after the warm-up of the plan the
    run ended on (`plan`; an elastic run's earlier plans had other stages)."""
    steps = final_steps(result.steps, lambda step: len(step["stages"]))
    table = Table(title=f"run summary (per-stage times: {AFTER_WARMUP})")
    for column in ("pipeline", "stage", "devices", "layers", "TP", "forward ms", "backward ms", "of which TP ms"):
        table.add_column(column, justify="right")
    for index, record in enumerate(result.steps[-1]["stages"]):
        stage = plan.pipelines[record["pipeline"]].stages[record["stage"]]
        fwd, bwd, tp = mean_over_steps(steps, "stages", index, ("forward_s", "backward_s", "tp_s"))
        table.add_row(str(record["pipeline"]), str(record["stage"]), ",".join(map(str, stage.devices)),
                      str(stage.layers), str(stage.tp), f"{fwd * 1e3:.1f}", f"{bwd * 1e3:.1f}",
                      f"{tp * 1e3:.1f}" if stage.tp > 1 else "")
    return table
