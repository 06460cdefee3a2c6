"""Per-device bars of a sequence plan (docs/sequence-plans.md §7.2, §7.3), one bar per member in plan order
(replica, ring position, member): what each device does in one iteration — linear, attention
and LM-head compute, all-to-all, the part of the ring not hidden under attention, ZeRO
gathers, the DP sync — and the wait that fills it up to T (the barriers of §7.2); and its
memory against capacity, split as §7.3 (states, gathered weights, activations, ring buffers,
logits, reserve). Every bar of the time chart adds up to the evaluator's T."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from hexiscale.viz.common import TEXT_MARGIN_IN, device_strip, stacked_bars, wrapped  # noqa: E402
from hexiscale.viz.sequence_ring import group_colours  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.sequence import cost  # noqa: E402
from planner.sequence.estimate import SeqEstimate  # noqa: E402
from planner.base import plural

TIME_PARTS = (("linear", "#4C72B0"), ("attention", "#DD8452"), ("lm_head", "#937860"), ("all_to_all", "#55A868"),
              ("ring (not hidden)", "#C44E52"), ("zero", "#8172B3"), ("dp_sync", "#DA8BC3"), ("wait", "#E8E8E8"))
MEMORY_PARTS = (("states", "#4C72B0"), ("gathered", "#64B5CD"), ("activations", "#DD8452"),
                ("ring_buffers", "#C44E52"), ("logits", "#937860"), ("reserve", "#AAAAAA"))


def member_times(problem: Problem, est: SeqEstimate) -> dict[str, np.ndarray]:
    """Per member (plan order), seconds per iteration of each part of TIME_PARTS; the parts of
    every member add up to T. Also `device`, `replica` and `group` (global group number)."""
    tr, layers = problem.training, problem.model.layers
    rho, r_a2a = cost.ring_rounds(tr), cost.a2a_rounds(tr)
    rows = []
    for rep in est.replicas:
        for group in rep.groups:
            for m in group.members:
                hidden = max(m.attention_s, rho * m.ring_s)
                per_mb = {"linear": layers * m.linear_s, "attention": layers * m.attention_s,
                          "lm_head": m.head_s, "all_to_all": layers * r_a2a * group.a2a_s,
                          "ring (not hidden)": layers * (hidden - m.attention_s),
                          "zero": layers * rep.zero_layer_s + rep.zero_ends_s}
                row = {k: v * rep.micro_batches for k, v in per_mb.items()}
                row["dp_sync"] = est.dp_s
                row["wait"] = max(0.0, est.iteration_s - sum(row.values()))  # barriers, other replicas
                rows.append((m.device, rep.index, group.index, row))
    out = {k: np.array([r[3][k] for r in rows]) for k, _ in TIME_PARTS}
    out["device"] = np.array([r[0] for r in rows])
    out["replica"] = np.array([r[1] for r in rows])
    groups = {(r[1], r[2]) for r in rows}
    number = {key: i for i, key in enumerate(sorted(groups))}
    out["group"] = np.array([number[(r[1], r[2])] for r in rows])
    return out


def member_memory(problem: Problem, est: SeqEstimate) -> dict[str, np.ndarray]:
    """Per member (plan order), GiB of each part of MEMORY_PARTS, and `total`, `capacity`."""
    ms = est.members
    out = {k: np.array([getattr(m, f"{k}_gib") for m in ms]) for k, _ in MEMORY_PARTS if k != "reserve"}
    out["total"] = np.array([m.memory_gib for m in ms])
    out["reserve"] = out["total"] - sum(out[k] for k, _ in MEMORY_PARTS if k != "reserve")
    out["capacity"] = np.array([m.capacity_gib for m in ms])
    return out


def _axis(ax, n: int, devices: np.ndarray, replica: np.ndarray, top: float) -> None:
    """Device ids under the bars and a strip in each member's replica colour."""
    x = np.arange(n)
    colours = group_colours(int(replica.max()) + 1)
    device_strip(ax, x, [colours[r] for r in replica], -top * 0.045, top * 0.03)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylim(-top * 0.06, top * 1.1)
    ax.set_xlim(-0.8, n - 0.2)
    step = max(1, n // 40)
    ax.set_xticks(x[::step], [str(d) for d in devices[::step]], fontsize=6 if n > 32 else 7)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)


def bars_figure(problem: Problem, est: SeqEstimate, title: str = ""):
    """Two panels: time per iteration and memory per device, one bar per member."""
    times, mem = member_times(problem, est), member_memory(problem, est)
    n = len(times["device"])
    x = np.arange(n)
    width = min(20, 4 + n * 0.25)
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(width, 7.4))
    fit = width - TEXT_MARGIN_IN  # the titles and labels wrap to the figure (cut at "bottleneck: lin" before)
    stacked_bars(ax_t, x, times, TIME_PARTS)
    ax_t.axhline(est.iteration_s, color="black", linestyle="--", linewidth=0.8)
    _axis(ax_t, n, times["device"], times["replica"], est.iteration_s)
    ax_t.set_ylabel("s per iteration")
    ax_t.set_title(wrapped(f"time per device in one iteration (dashed: T = {est.iteration_s:.4g} s; "
                           f"bottleneck: {est.bottleneck.kind.replace('_', ' ')})", fit, 9), fontsize=9, loc="left")
    stacked_bars(ax_m, x, mem, MEMORY_PARTS)
    ax_m.scatter(x, mem["capacity"], marker="_", s=140, color="black", linewidths=2, label="capacity", zorder=3)
    over = mem["total"] > mem["capacity"]
    if over.any():
        ax_m.scatter(x[over], mem["total"][over], marker="v", color="red", zorder=4, label="over capacity")
    _axis(ax_m, n, times["device"], times["replica"], float(max(mem["capacity"].max(), mem["total"].max())))
    ax_m.set_ylabel("GiB per device")
    ax_m.set_xlabel(wrapped("device id, in plan order (strip under the axis: replica colour)", fit))
    ax_m.set_title(wrapped(f"memory per device vs capacity (smallest headroom {est.min_headroom_gib:.2f} GiB)", fit, 9),
                   fontsize=9, loc="left")
    idle = problem.cluster.num_devices - n
    fig.suptitle(wrapped((title + "\n" if title else "") + f"{plural(n, 'device')} used"
                         + (f", {idle} idle (not drawn)" if idle else ""), width - 0.2),
                 fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def draw_bars(problem: Problem, est: SeqEstimate, path, title: str = "") -> None:
    """Write the time and memory bars to `path` (PNG)."""
    fig = bars_figure(problem, est, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
