"""Terminal views of sequence plans (docs/sequence-plans.md §7) and their estimates: per member, per group
and per replica tables, the iteration summary, the solved plan, and a run of one (its
per-member summary, the units its run record times). `hexiscale.cli.views` picks this module
for a `SeqPlan`, as it picks `layered_views` for a layered plan."""

from __future__ import annotations

from rich import box
from rich.table import Table

from hexiscale.cli.layered_views import time_unit
from hexiscale.cli.idle_views import explained_idle
from hexiscale.cli.plan_summary import (composition, composition_words, device_use_table, is_large, plural,
                                        shape_table)
from hexiscale.cli.run_steps import AFTER_WARMUP, final_steps, mean_over_steps
from hexiscale.cli.price_views import price_rows
from hexiscale.cli.vendor_views import bridge_table
from hexiscale.cli.views import plain
from planner.base import format_runs, format_seconds as seconds
from planner.problem import Problem
from planner.sequence.bridge import sequence_bridge_traffic
from solvers.sequence.idle import explain_idle
from planner.sequence.estimate import SeqEstimate
from planner.sequence.plan import SeqPlan

SUMMARY_ABOVE_MEMBERS = 64  # larger plans get one row per replica unless --full is asked


def _free(headroom: float) -> str:
    return f"[red]{headroom:.1f}[/]" if headroom < 0 else f"{headroom:.1f}"


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...] = ()) -> Table:
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1),
                  collapse_padding=True, pad_edge=False)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    return table


def member_table_view(est: SeqEstimate) -> Table:
    unit, div = time_unit([x for m in est.members for x in (m.linear_s, m.attention_s, m.ring_s, m.head_s)])
    table = _table(f"members (r.g.i = replica.group.member; Clin, Catt, ring per layer and micro-batch, "
                   f"Chead per micro-batch, in {unit}; memory GiB per device)",
                   ("r.g.i", "machine", "device", "heads", "tokens", "Clin", "Catt", "ring", "Chead",
                    "mem/cap", "free"), left=("machine",))
    for m in est.members:
        table.add_row(f"{m.replica}.{m.group}.{m.index}", plain(m.machine), str(m.device), str(m.heads), str(m.tokens),
                      *(f"{x / div:.3g}" for x in (m.linear_s, m.attention_s, m.ring_s, m.head_s)),
                      f"{m.memory_gib:.1f}/{m.capacity_gib:.0f}", _free(m.headroom_gib))
    return table


def group_table_view(est: SeqEstimate) -> Table:
    unit, div = time_unit([x for g in est.groups for x in (g.a2a_s, g.ring_s)])
    table = _table(f"groups (all-to-all and ring per layer and micro-batch, in {unit}; bandwidths GB/s)",
                   ("r.g", "members", "T_g", "x_g", "a2a qkv", "a2a out", "HP bw", "ring", "ring bw"))
    for g in est.groups:
        table.add_row(f"{g.replica}.{g.index}", str(len(g.members)), str(g.tokens), str(g.first_token),
                      f"{g.a2a_qkv_s / div:.3g}", f"{g.a2a_out_s / div:.3g}",
                      "-" if g.hp_bw_gbps is None else f"{g.hp_bw_gbps:g}", f"{g.ring_s / div:.3g}",
                      f"{g.ring_bw_gbps:g}" if len(est.replicas[g.replica].groups) > 1 else "-")
    return table


def replica_table_view(est: SeqEstimate) -> Table:
    """One row per replica: what a plan of thousands of members can be read as."""
    unit, div = time_unit([r.time_s for r in est.replicas])
    table = _table(f"replicas (T_layer, Z_layer, T_mb, T_rep in {unit})",
                   ("r", "batch", "m", "groups", "devices", "T_layer", "Z_layer", "T_mb", "T_rep", "min free GiB"))
    for r in est.replicas:
        free = min(m.headroom_gib for g in r.groups for m in g.members)
        table.add_row(str(r.index), str(r.batch), str(r.micro_batches), str(len(r.groups)), str(r.devices),
                      *(f"{x / div:.4g}" for x in (r.layer_s, r.zero_layer_s, r.micro_batch_s, r.time_s)),
                      _free(free))
    return table


def summary_view(problem: Problem, est: SeqEstimate) -> Table:
    table = Table(title="iteration", show_header=False, box=box.SIMPLE)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    slowest = max(est.replicas, key=lambda r: r.time_s)
    table.add_row("T (iteration)", seconds(est.iteration_s))
    table.add_row("max T_rep", f"{seconds(est.replica_s)}  (replica {slowest.index})")
    table.add_row("T_dp", seconds(est.dp_s))
    for r in est.replicas[:SUMMARY_ABOVE_MEMBERS]:
        table.add_row(f"  replica {r.index}", (
            f"B_r={r.batch}, m={r.micro_batches}, {plural(len(r.groups), 'group')} on {plural(r.devices, 'device')}: "
            f"{seconds(r.time_s)} (T_layer {seconds(r.layer_s)}: linear {seconds(r.linear_s)}, "
            f"all-to-all {seconds(r.a2a_s)}, attention {seconds(r.attention_s)}, ring {seconds(r.ring_s)})"))
    table.add_row("tokens/s", f"{est.tokens_per_s:,.0f}")
    table.add_row("MFU", f"{est.mfu:.1%}")
    for label, text in price_rows(problem, [m.device for m in est.members], est):
        table.add_row(label, text)
    table.add_row("min headroom", f"{est.min_headroom_gib:.2f} GiB")
    table.add_row("bottleneck", f"{est.bottleneck.kind}: {plain(est.bottleneck.description)}")
    return table


def estimate_views(problem: Problem, est: SeqEstimate, full: bool | None = None) -> list[Table]:
    """What `hexiscale evaluate` prints for a sequence plan: every member and group, or (by
    default above SUMMARY_ABOVE_MEMBERS members) one row per replica."""
    if full is None:
        full = len(est.members) <= SUMMARY_ABOVE_MEMBERS
    tables = [member_table_view(est), group_table_view(est)] if full else [replica_table_view(est)]
    return tables + [summary_view(problem, est)]


def plan_table(problem: Problem, plan: SeqPlan, estimate: SeqEstimate) -> Table:
    table = Table(title=f"sequence plan for {plain(problem.name)}", box=box.SIMPLE_HEAVY)
    for col in ("replica", "batch", "group", "devices", "heads", "tokens", "T_g", "min free GiB"):
        table.add_column(col, justify="left" if col in ("devices", "heads", "tokens") else "right")
    for r, (rep, re) in enumerate(zip(plan.replicas, estimate.replicas)):
        for g, (grp, ge) in enumerate(zip(rep.ring, re.groups)):
            table.add_row(str(r) if g == 0 else "", str(rep.batch) if g == 0 else "", str(g),
                          format_runs(grp.devices), ",".join(str(m.heads) for m in grp.members),
                          ",".join(str(m.tokens) for m in grp.members), str(grp.tokens),
                          _free(min(m.headroom_gib for m in ge.members)))
    return table


def plan_shape(plan: SeqPlan) -> str:
    """One line: each replica's batch and ring, a group as hp{members}×{T_g}."""
    return " | ".join(f"B{r.batch}: " + "→".join(f"hp{len(g.members)}×{g.tokens}" for g in r.ring)
                      for r in plan.replicas)


def replica_shapes_view(problem: Problem, plan: SeqPlan, est: SeqEstimate) -> Table:
    """The plan's replicas grouped by what their groups are (GPU types and members, counted)."""
    cluster, units = problem.cluster, []
    for rep, re in zip(plan.replicas, est.replicas):
        gpus = [sorted({cluster.machines[int(cluster.machine_of_device[d])].gpu for d in g.devices}) for g in rep.ring]
        parts = composition([f"{'+'.join(types)} hp{len(g.members)}" for types, g in zip(gpus, rep.ring)])
        words = f"{plural(len(rep.ring), 'group')}: {composition_words(parts)}"
        units.append((parts, words, re.time_s, rep.batch))
    groups = sum(len(r.ring) for r in plan.replicas)
    return shape_table(f"{plural(len(plan.replicas), 'replica')} of {plural(groups, 'group')}, grouped by their "
                       f"groups (--full: every group)", ("batch", "T_rep", "ring"), units)


def idle_view(problem: Problem, plan: SeqPlan, est: SeqEstimate, deadline: float | None = None) -> Table | None:
    """Why devices stay idle (`explain_idle` of this kind), or None when none are."""
    return explained_idle(problem, plan, est, explain_idle, deadline)


def bridge_view(problem: Problem, plan: SeqPlan, est: SeqEstimate) -> Table | None:
    """On a cluster that mixes nvidia and amd: what of T and which bytes cross the bridge."""
    if not problem.cluster.mixes_vendors:
        return None
    return bridge_table(problem, sequence_bridge_traffic(problem, plan))


def solved_views(problem: Problem, plan: SeqPlan, est: SeqEstimate, *, full: bool = False,
                 deadline: float | None = None) -> list[Table]:
    """What `hexiscale solve` prints before the solver's status: the plan (every group, or for a
    large plan unless `full`, its replicas by shape and its devices per GPU type), idle devices,
    and why (`solvers.sequence.idle`, within `deadline`), and the cross-vendor traffic on a
    mixed-vendor cluster."""
    groups = sum(len(r.ring) for r in plan.replicas)
    if full or not is_large(len(plan.replicas), groups):
        head = [plan_table(problem, plan, est)]
    else:
        head = [replica_shapes_view(problem, plan, est), device_use_table(problem, plan.devices)]
    extra = [idle_view(problem, plan, est, deadline), bridge_view(problem, plan, est)]
    return head + [view for view in extra if view is not None]


# -- a run of the plan ----------------------------------------------------------------------

PREDICTION_TITLE = ("predicted (cost model) against measured: replica T_mb per micro-batch (its slowest member's "
                    "forward + backward), step T (micro-batches + gradient sync, optimizer left out)")
MEMBER_KEYS = ("replica", "group", "member", "device", "tokens")  # which plan a step's member record ran


def timed_units(plan: SeqPlan) -> list[tuple[str, str, str]]:
    """(unit, devices, shape) of each unit a run record times: every replica (its slowest member)."""
    return [(f"replica {r}", ",".join(map(str, rep.devices)),
             f"batch {rep.batch}, " + " → ".join("+".join(f"{m.heads}h/{m.tokens}t" for m in g.members)
                                                  for g in rep.ring))
            for r, rep in enumerate(plan.replicas)]


def run_table(result, plan: SeqPlan) -> Table:
    """Per-member mean forward/backward time over the steps after the warm-up of the plan the
    run ended on (an elastic run's earlier plans had other members; `plan` is not needed: each
    step's member records say which member of which plan ran)."""
    steps = final_steps(result.steps, lambda step: [tuple(m[k] for k in MEMBER_KEYS) for m in step["members"]])
    table = Table(title=f"run summary (per-member times: {AFTER_WARMUP})")
    for column in ("replica", "group", "member", "device", "tokens", "forward ms", "backward ms",
                   "of which HP ms", "ZeRO ms"):
        table.add_column(column, justify="right")
    for index, record in enumerate(result.steps[-1]["members"]):
        times = mean_over_steps(steps, "members", index, ("forward_s", "backward_s", "hp_s", "zero_s"))
        table.add_row(*(str(record[k]) for k in MEMBER_KEYS), *(f"{t * 1e3:.1f}" for t in times))
    return table
