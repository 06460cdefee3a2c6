"""The cluster as a picture: machines as boxes of devices, links between machines, and the
plan on top — each pipeline in its own colour, each device labelled with its stage index,
arrows along each pipeline's stage order, idle devices hollow."""

from __future__ import annotations

import itertools
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection, PatchCollection  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from planner.layered.plan import Plan  # noqa: E402
from planner.prices import rented_machines  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.base import plural


def pipeline_colours(num: int) -> list:
    cmap = plt.get_cmap("tab10" if num <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(num)]


def machine_centres(num: int) -> np.ndarray:
    """Machines on a grid, row by row in file order (readable up to a few dozen)."""
    cols = max(1, math.ceil(math.sqrt(num * 1.6)))
    return np.array([(i % cols * 3.2, -(i // cols) * 2.6) for i in range(num)], dtype=float)


def device_positions(problem: Problem, centres: np.ndarray) -> np.ndarray:
    """Each device inside its machine's box, in a grid of up to 4 columns."""
    pos = np.zeros((problem.cluster.num_devices, 2))
    for m, machine in enumerate(problem.cluster.machines):
        cols = min(4, machine.count)
        rows = math.ceil(machine.count / cols)
        for i, d in enumerate(problem.cluster.devices_of(m)):
            pos[d] = centres[m] + ((i % cols - (cols - 1) / 2) * 0.6, ((rows - 1) / 2 - i // cols) * 0.6)
    return pos


MESH_MACHINES = 16  # up to this many machines every pair is drawn (bent around boxes, labelled ≤ 6)
MAX_DRAWN_LINKS = 500  # above it: the fastest non-default pairs only, as straight lines
ALL_PAIRS_MACHINES = 2000  # above it the candidates are the pairs of racks and listed links only


def _draw_links(ax, problem: Problem, centres: np.ndarray) -> None:
    """Machine-to-machine links, line width by bandwidth. Up to MESH_MACHINES machines every
    pair; above, only the pairs that differ from the default inter-machine bandwidth (racks,
    listed links) — a full mesh would only hide the plan, and 10^4 bent patches take minutes."""
    cluster = problem.cluster
    n = len(cluster.machines)
    i, j = np.triu_indices(n, k=1) if n <= ALL_PAIRS_MACHINES else _rack_and_link_pairs(cluster)
    bw = np.asarray(cluster.pair_bw(i, j), dtype=float)
    if n > MESH_MACHINES:
        keep = np.flatnonzero(bw != float(cluster.inter_bw_gbps))
        keep = keep[np.argsort(-bw[keep], kind="stable")[:MAX_DRAWN_LINKS]]
        i, j, bw = i[keep], j[keep], bw[keep]
    if len(bw) == 0:
        return
    top = float(bw.max())
    if n > MESH_MACHINES:
        segments = np.stack([centres[i], centres[j]], axis=1)
        ax.add_collection(LineCollection(segments, colors="#BBBBBB", zorder=0, linewidths=0.5 + 3.0 * bw / top))
        return
    for a_index, b_index, value in zip(i, j, bw):
        _draw_mesh_link(ax, centres, (int(a_index), int(b_index)), value, top, labelled=n <= 6)


def _rack_and_link_pairs(cluster) -> tuple[np.ndarray, np.ndarray]:
    """The machine pairs (i < j) a rack or a listed link joins: on clusters of more than
    ALL_PAIRS_MACHINES machines the only candidates for a non-default link drawn (every pair of
    12,500 machines is 78 million, and their arrays took gigabytes; pairs slower only by the
    vendor bridge are left out there)."""
    groups = [sorted(cluster.machine_index[name] for name in rack.machines) for rack in cluster.racks]
    pairs = [np.array(list(itertools.combinations(g, 2)), dtype=np.int64).reshape(-1, 2) for g in groups]
    n, keys = len(cluster.machines), cluster.bw_table.keys
    pairs.append(np.stack([keys // n, keys % n], axis=1))
    both = np.unique(np.concatenate(pairs), axis=0)
    return both[:, 0], both[:, 1]


def _draw_mesh_link(ax, centres: np.ndarray, pair: tuple[int, int], bw: float, top: float, labelled: bool) -> None:
    a, b = centres[pair[0]], centres[pair[1]]
    # a straight line through another machine's box would hide under it: bend it
    rad = 0.3 if _passes_through(a, b, centres, pair) else 0.0
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-", connectionstyle=f"arc3,rad={rad}",
                                 color="#BBBBBB", zorder=0, linewidth=0.5 + 3.0 * bw / top))
    if labelled:
        mid = (a + b) / 2 + rad * np.array([b[1] - a[1], a[0] - b[0]]) / 2  # on the arc
        # above the machine boxes (zorder 1), on a white patch: a label between two
        # neighbouring boxes is wider than the gap and was half hidden under them
        ax.text(mid[0], mid[1], f"{bw:g} GB/s", fontsize=6, color="#555555", ha="center",
                va="center", zorder=2.5, bbox=dict(boxstyle="round,pad=0.15", facecolor="white",
                                                   edgecolor="#BBBBBB", linewidth=0.4))


def _passes_through(a: np.ndarray, b: np.ndarray, centres: np.ndarray, skip: tuple[int, int]) -> bool:
    """Whether segment a–b passes within a box's half-height of another machine's centre."""
    ab = b - a
    for k, c in enumerate(centres):
        if k in skip:
            continue
        t = float(np.dot(c - a, ab) / np.dot(ab, ab))
        if 0 < t < 1 and np.linalg.norm(a + t * ab - c) < 0.8:
            return True
    return False


def _rent_label(problem: Problem, m: int, rented: frozenset[int] | set[int]) -> str:
    """A priced machine's rent and whether the plan rents it (docs/prices.md §13); '' unpriced."""
    if not problem.cluster.priced:
        return ""
    return f"\n${float(problem.cluster.machine_rent[m]):,.2f}/h " + ("rented" if m in rented else "not rented")


def _box_size(count: int) -> tuple[float, float]:
    """(width, height) of a machine's box around `device_positions`' grid of its devices."""
    cols = min(4, count)
    return cols * 0.6 + 0.3, math.ceil(count / cols) * 0.6 + 0.3


def _draw_machines(ax, problem: Problem, centres: np.ndarray, rented: frozenset[int] | set[int] = frozenset()) -> None:
    """Machine boxes with their labels; an unrented machine of a priced cluster is dashed and grey."""
    for m, machine in enumerate(problem.cluster.machines):
        w, h = _box_size(machine.count)
        cx, cy = centres[m]
        left = problem.cluster.priced and m not in rented
        ax.add_patch(FancyBboxPatch((cx - w / 2, cy - h / 2), w, h, boxstyle="round,pad=0.05",
                                    facecolor="#f2f2f2" if left else "white", edgecolor="#555555",
                                    linestyle="--" if left else "-", zorder=1))
        ax.text(cx, cy + h / 2 + 0.12, f"{machine.name}\n{machine.count}× {machine.gpu}, "
                f"{machine.intra_bw_gbps:g} GB/s" + _rent_label(problem, m, rented), ha="center", va="bottom",
                fontsize=6.5, color="#888888" if left else "black")


# Above this many devices the picture is drawn dense: one marker per device without its stage
# number, stage order as straight segments, machine boxes without labels, and the legend's first
# pipelines only. At 10^5 devices a label per device and an arrow per stage are 10^5 and 10^4
# artists (`show` was stopped after 10 minutes there, with the Gantt chart's every block and the
# links' every pair), and nobody reads 10^5 numbers: the dense picture shows where each pipeline sits.
DENSE_DEVICES = 512
LEGEND_PIPELINES = 20  # pipelines named in a dense picture's legend


def draw_cluster(problem: Problem, plan: Plan, path, title: str = "") -> None:
    """Write the cluster graph with the plan's pipelines and stages to `path` (PNG)."""
    centres = machine_centres(len(problem.cluster.machines))
    pos = device_positions(problem, centres)
    colours = pipeline_colours(len(plan.pipelines))
    dense = problem.cluster.num_devices > DENSE_DEVICES
    lo, hi = centres.min(axis=0) - (1.7, 1.4), centres.max(axis=0) + (1.7, 1.9)
    scale = min(1.0, 16.0 / (hi[0] - lo[0]), 14.0 / (hi[1] - lo[1]))  # keep big clusters on a page
    fig, ax = plt.subplots(figsize=(3.2 + (hi[0] - lo[0]) * scale, 0.9 + (hi[1] - lo[1]) * scale))
    _draw_links(ax, problem, centres)
    used = set(plan.devices)
    (_draw_machine_cells if dense else _draw_machines)(ax, problem, centres, set(rented_machines(problem, used)))
    idle = [d for d in range(problem.cluster.num_devices) if d not in used]
    marker = max(1.0, 120 * scale ** 2) if dense else 120
    ax.scatter(pos[idle, 0], pos[idle, 1], s=marker, facecolors="white", edgecolors="#999999", zorder=3,
               linewidths=0.3 if dense else 1.0)
    (_draw_pipelines_dense if dense else _draw_pipelines)(ax, plan, pos, colours, marker)
    if idle:
        ax.scatter([], [], s=60, facecolors="white", edgecolors="#999999", label=f"idle ({len(idle)})")
    if problem.cluster.priced:  # docs/prices.md §13: whole machines are rented
        rented = rented_machines(problem, used)
        rent = float(problem.cluster.machine_rent[list(rented)].sum())
        ax.plot([], [], color="#555555", label=f"rented: {len(rented)} machines, ${rent:,.2f}/h")
        ax.plot([], [], color="#555555", linestyle="--",
                label=f"not rented ({len(problem.cluster.machines) - len(rented)})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    ax.set_aspect("equal")
    ax.axis("off")
    what = ("devices by pipeline (colour); lines: stage order (dense: "
            f"{problem.cluster.num_devices:,} devices, no stage numbers)" if dense else
            "devices by pipeline (colour) and stage (number); arrows: stage order")
    fig.suptitle((title + "\n" if title else "") + what, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _legend_entry(ax, p: int, pipe, colour) -> None:
    ax.scatter([], [], s=60, color=colour, label=f"pipeline {p}: {plural(len(pipe.stages), 'stage')}, batch {pipe.batch}")


def _draw_pipelines(ax, plan: Plan, pos: np.ndarray, colours: list, marker: float) -> None:
    """Each device in its pipeline's colour with its stage number; arrows between stage leaders."""
    for p, pipe in enumerate(plan.pipelines):
        leaders = []
        for k, stage in enumerate(pipe.stages):
            xy = pos[list(stage.devices)]
            ax.scatter(xy[:, 0], xy[:, 1], s=marker, color=colours[p], edgecolors="black", linewidths=0.4, zorder=3)
            for x, y in xy:
                ax.text(x, y, str(k), ha="center", va="center", fontsize=6, color="white", zorder=4)
            leaders.append(pos[stage.leader])
        for a, b in zip(leaders, leaders[1:]):  # activation flow between stage leaders
            ax.annotate("", xy=b, xytext=a, zorder=2, arrowprops=dict(
                arrowstyle="-|>", color=colours[p], lw=1.2, alpha=0.8, connectionstyle="arc3,rad=0.15"))
        _legend_entry(ax, p, pipe, colours[p])


def _draw_pipelines_dense(ax, plan: Plan, pos: np.ndarray, colours: list, marker: float) -> None:
    """Every used device in one scatter, the stage order in one collection of segments."""
    devices = [d for pipe in plan.pipelines for stage in pipe.stages for d in stage.devices]
    of_device = [p for p, pipe in enumerate(plan.pipelines) for stage in pipe.stages for _ in stage.devices]
    ax.scatter(pos[devices, 0], pos[devices, 1], s=marker, c=[colours[p] for p in of_device], linewidths=0, zorder=3)
    segments, segment_colours = [], []
    for p, pipe in enumerate(plan.pipelines):
        leaders = pos[[stage.leader for stage in pipe.stages]]
        segments += [(a, b) for a, b in zip(leaders, leaders[1:])]
        segment_colours += [colours[p]] * (len(leaders) - 1)
    if segments:
        ax.add_collection(LineCollection(segments, colors=segment_colours, linewidths=0.4, alpha=0.6, zorder=2))
    for p, pipe in enumerate(plan.pipelines[:LEGEND_PIPELINES]):
        _legend_entry(ax, p, pipe, colours[p])
    if len(plan.pipelines) > LEGEND_PIPELINES:
        ax.scatter([], [], s=0, label=f"… {len(plan.pipelines) - LEGEND_PIPELINES:,} more pipelines")


def _draw_machine_cells(ax, problem: Problem, centres: np.ndarray, rented: frozenset[int] | set[int] = frozenset()) -> None:
    """Machine boxes as one collection, without labels (the dense picture; unrented: grey)."""
    boxes, faces = [], []
    for m, machine in enumerate(problem.cluster.machines):
        w, h = _box_size(machine.count)
        boxes.append(Rectangle((centres[m][0] - w / 2, centres[m][1] - h / 2), w, h))
        faces.append("#f2f2f2" if problem.cluster.priced and m not in rented else "white")
    ax.add_collection(PatchCollection(boxes, facecolors=faces, edgecolors="#999999", linewidths=0.3, zorder=1))
