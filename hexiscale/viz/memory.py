"""Per-device memory against capacity: one bar per device, split into parameter state,
activations and the runtime reserve (docs/cost-model.md §3.5), capacity as a black tick."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from hexiscale.viz.cluster import pipeline_colours  # noqa: E402
from hexiscale.viz.common import TEXT_MARGIN_IN, device_strip, stacked_bars, wrapped  # noqa: E402
from planner.layered.estimate import Estimate  # noqa: E402
from planner.base import GIB  # noqa: E402
from planner.problem import Problem  # noqa: E402


def device_memory(problem: Problem, estimate: Estimate) -> dict[str, np.ndarray]:
    """Per device (GiB): state, activations, reserve, total, capacity, pipeline (-1: idle)."""
    cluster, training = problem.cluster, problem.training
    n = cluster.num_devices
    out = {k: np.zeros(n) for k in ("state", "activation", "reserve", "total")}
    out["capacity"] = cluster.machine_memory_bytes[cluster.machine_of_device] / GIB
    out["pipeline"] = np.full(n, -1)
    for pipe in estimate.pipelines:
        for st in pipe.stages:  # the estimate's own parts: the bars are the evaluator's figures
            for d in st.devices:
                out["state"][d], out["activation"][d] = st.states_gib, st.activations_gib
                out["reserve"][d] = training.reserved_gib
                out["total"][d] = st.memory_gib  # the evaluator's figure: the bar must match it
                out["pipeline"][d] = pipe.index
    return out


MEMORY_PARTS = (("state", "#4C72B0"), ("activation", "#DD8452"), ("reserve", "#AAAAAA"))


def draw_memory(problem: Problem, estimate: Estimate, path, title: str = "") -> None:
    """Write the memory bars to `path` (PNG)."""
    mem = device_memory(problem, estimate)
    n = problem.cluster.num_devices
    x = np.arange(n)
    colours = pipeline_colours(max(1, len(estimate.pipelines)))
    width = min(20, 3 + n * 0.22)
    fig, ax = plt.subplots(figsize=(width, 4.2))
    stacked_bars(ax, x, mem, MEMORY_PARTS)
    ax.scatter(x, mem["capacity"], marker="_", s=140, color="black", linewidths=2, label="capacity", zorder=3)
    # a strip under the bars: which pipeline each device works for (grey: idle)
    top = float(max(mem["capacity"].max(), mem["total"].max()))
    strip = [colours[p] if p >= 0 else "#DDDDDD" for p in mem["pipeline"]]
    device_strip(ax, x, strip, -top * 0.045, top * 0.03)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylim(-top * 0.06, top * 1.08)
    over = mem["total"] > mem["capacity"]
    if over.any():
        ax.scatter(x[over], mem["total"][over], marker="v", color="red", zorder=4, label="over capacity")
    ax.set_xlim(-0.8, n - 0.2)
    ax.set_xlabel(wrapped("device id (strip under the axis: pipeline colour, grey: idle)", width - TEXT_MARGIN_IN))
    ax.set_ylabel("GiB per device")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(wrapped((title + "\n" if title else "") + f"memory per device vs capacity "
                         f"(smallest headroom {estimate.min_headroom_gib:.2f} GiB)", width - TEXT_MARGIN_IN, 9),
                 fontsize=9, loc="left")
    if n > 64:
        ax.set_xticks(x[:: max(1, n // 32)])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
