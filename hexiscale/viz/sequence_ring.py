"""A sequence plan's rings (docs/sequence-plans.md §7.1) as a picture: one row per replica. Left, the ring
as a donut read clockwise from the top in ring order: the outer wedges are the groups, sized
by their token share T_g (they add up to s), the inner wedges the members of each group, sized
by the tokens t_i they hold outside attention, labelled with device and heads (the heads of a
group add up to a). Right, the mirrored token layout of §7.1: where along the sequence 0..s
each group's two half-shards lie."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hexiscale.viz.common import wrapped  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.sequence.plan import SeqPlan  # noqa: E402
from planner.base import plural

MAX_REPLICAS = 6  # rows drawn; the title says how many more there are
LABEL_SHARE = 0.035  # wedges smaller than this share of the ring carry no label
GROUP_LABEL_MAX = 16  # groups labelled in the donut at most; more: only the layout strip names them


def group_colours(num: int) -> list:
    cmap = plt.get_cmap("tab10" if num <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(num)]


def ring_shares(problem: Problem, plan: SeqPlan) -> list[list[dict]]:
    """Per replica, per group in ring order: its tokens T_g, first token x_g, and members as
    (device, machine, heads, tokens). What the picture draws, to be checked against s and a."""
    cluster, out = problem.cluster, []
    for rep in plan.replicas:
        groups, x = [], 0
        for g, group in enumerate(rep.ring):
            members = [(m.device, cluster.machines[cluster.machine_of_device[m.device]].name, m.heads, m.tokens)
                       for m in group.members]
            groups.append({"index": g, "tokens": group.tokens, "first_token": x, "members": members})
            x += group.tokens // 2
        out.append(groups)
    return out


MEMBER_LINES = 12  # member lines listed beside a replica's layout strip at most


def tokens_text(n: int) -> str:
    """20480 → 20K, 1048576 → 1M, 320 → 320."""
    if n >= 1 << 20:
        return f"{n / (1 << 20):.3g}M"
    return f"{n / 1024:.3g}K" if n >= 10240 else str(n)


def _member_label(device: int, machine: str, heads: int, tokens: int, count: int) -> str:
    """Short labels when the ring has many members (the listing beside it has every figure)."""
    if count > 16:
        return f"d{device}"
    return f"d{device}\n{heads}h" if count > 4 else f"d{device}\n{heads}h·{tokens_text(tokens)}"


def _member_lines(groups: list[dict]) -> str:
    """The members as text, one line per group: device (machine) heads, tokens."""
    lines = [f"g{g['index']}  T={tokens_text(g['tokens'])}: " + ", ".join(
        f"d{d} {machine} {h}h {tokens_text(t)}" for d, machine, h, t in g["members"]) for g in groups]
    more = len(lines) - MEMBER_LINES
    lines = [line if len(line) <= 110 else line[:107] + "…" for line in lines[:MEMBER_LINES]]
    return "\n".join(lines + ([f"… and {more} more groups"] if more > 0 else []))


def _donut(ax, groups: list[dict], s: int, heads: int, colours: list) -> None:
    sizes = [g["tokens"] for g in groups]
    few = len(groups) <= GROUP_LABEL_MAX
    labels = [f"g{g['index']}: {tokens_text(g['tokens'])} ({g['tokens'] / s:.0%})" if few and g["tokens"] / s >= LABEL_SHARE
              else "" for g in groups]
    outer, _ = ax.pie(sizes, radius=1.0, colors=colours, labels=labels, startangle=90, counterclock=False,
                      wedgeprops={"width": 0.24, "edgecolor": "white", "linewidth": 1.0},
                      labeldistance=1.08, textprops={"fontsize": 7})
    for w in outer:
        w.set_gid("group")
    members = [(m, colours[k]) for k, g in enumerate(groups) for m in g["members"]]
    many = len(members) > 12
    inner_labels = [_member_label(*m, len(members)) if m[3] / s >= LABEL_SHARE * (2 if many else 1) else ""
                    for m, _ in members]
    inner, _ = ax.pie([m[3] for m, _ in members], radius=0.76, startangle=90, counterclock=False,
                      colors=[(*c[:3], 0.45) for _, c in members], labels=inner_labels, labeldistance=0.72,
                      wedgeprops={"width": 0.42, "edgecolor": "white", "linewidth": 0.6},
                      textprops={"fontsize": 6 if many else 7, "ha": "center"})
    for w in inner:
        w.set_gid("member")
    ax.text(0, 0, f"s={tokens_text(s)}\na={heads}", ha="center", va="center", fontsize=7)
    ax.annotate("", xy=(0.35, 1.12), xytext=(-0.35, 1.12),  # ring order: clockwise from the top
                arrowprops={"arrowstyle": "->", "color": "black", "connectionstyle": "arc3,rad=-0.25"})
    ax.set_aspect("equal")


def _layout_strip(ax, groups: list[dict], s: int, colours: list) -> None:
    """The sequence 0..s: group g holds [x_g, x_g+ℓ_g) ∪ [s−x_g−ℓ_g, s−x_g), ℓ_g = T_g/2."""
    for k, g in enumerate(groups):
        half, x = g["tokens"] // 2, g["first_token"]
        for start in (x, s - x - half):
            ax.broken_barh([(start, half)], (0, 1), facecolors=colours[k], edgecolors="white", linewidth=0.4)
            if half / s >= 0.025 and len(groups) <= 24:
                ax.text(start + half / 2, 0.5, f"g{g['index']}", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, s)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ticks = [0, s // 4, s // 2, 3 * s // 4, s]
    ax.set_xticks(ticks, [tokens_text(t) for t in ticks], fontsize=7)
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    ax.set_xlabel(wrapped("token position (mirrored layout of §7.1: each group holds both ends of its span)",
                          width_in, 7), fontsize=7)


def ring_figure(problem: Problem, plan: SeqPlan, title: str = ""):
    """The figure: a donut and a layout strip per replica (up to MAX_REPLICAS)."""
    shares = ring_shares(problem, plan)
    shown = shares[:MAX_REPLICAS]
    s, a = problem.training.seq_len, problem.model.heads
    height = 3.3 * len(shown) + 0.8
    fig = plt.figure(figsize=(12, height))
    grid = fig.add_gridspec(len(shown), 2, width_ratios=(1.0, 2.2), hspace=0.35, wspace=0.12)
    for r, groups in enumerate(shown):
        colours = group_colours(len(groups))
        rep = plan.replicas[r]
        _donut(fig.add_subplot(grid[r, 0]), groups, s, a, colours)
        right = grid[r, 1].subgridspec(2, 1, height_ratios=(1, 3), hspace=0.9)
        strip = fig.add_subplot(right[0])
        _layout_strip(strip, groups, s, colours)
        hp = sorted({len(g["members"]) for g in groups})
        strip.set_title(f"replica {r}: batch {rep.batch}, {len(groups)} group{'s' * (len(groups) > 1)} in the ring, "
                        f"{plural(len(rep.devices), 'device')}, HP degree {'/'.join(map(str, hp))}", fontsize=9, loc="left")
        text = fig.add_subplot(right[1])
        text.axis("off")
        text.text(0, 1, _member_lines(groups), va="top", ha="left", fontsize=7, family="monospace",
                  transform=text.transAxes)
    more = f" (first {MAX_REPLICAS} of {plural(len(shares), 'replica')})" if len(shares) > MAX_REPLICAS else ""
    fig.suptitle((title + "\n" if title else "") + "rings, clockwise from the top in ring order: outer wedges = "
                 "groups by token share T_g (sum s), inner = members by tokens t_i (d = device, h = heads)" + more,
                 fontsize=9, x=0.01, ha="left", va="bottom", y=1.0 + 0.1 / height)  # above every panel title
    return fig


def draw_ring(problem: Problem, plan: SeqPlan, path, title: str = "") -> None:
    """Write the ring picture to `path` (PNG)."""
    fig = ring_figure(problem, plan, title)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
