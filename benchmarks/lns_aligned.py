"""bench_lns's enumeration of aligned plans (each machine the same block of layers in every
pipeline, at most two kinds of pipeline, every machine order)."""

from __future__ import annotations

import math
import time

import numpy as np

from lns_moves import copy


# -- the aligned family, enumerated -------------------------------------------------------
# Every layer's D holders on one machine (a layer synced across machines costs 0.1–0.5 s over
# 10 GbE), so each used machine holds one block of λ_M layers in every pipeline; n_A alike
# pipelines of c_A[M] devices per machine and n_B alike ones of the rest. For a steady period
# s per kind, a machine's cell (its devices in one pipeline, λ_M layers) is best cut into the
# TP groups and layer counts of least Σ τ with every τ ≤ s; the fluid T' of the two kinds,
# (M − D + n_A·B_A/s_A + n_B·B_B/s_B) / (n_A/s_A + n_B/s_B), is then separable by machine,
# a DP over Σ λ_M = L for every pair (s_A, s_B). The best pairs' plans are priced exactly.


class Cells:
    """Per machine (by its figures): least Σ τ of a cell for every s of a grid."""

    def __init__(self, space, grid):
        from planner.layered import cost
        from planner.layered.cost import StageShape
        self.space, self.grid, self.cost, self.Shape = space, grid, cost, StageShape
        p = space.problem
        self.key = [(m.gpu, m.intra_bw_gbps) for m in p.cluster.machines]
        self.cache = {}
        self.groups = {c: widths_upto(c, sorted(space.widths)) for c in range(max(space.counts) + 1)}

    def stage(self, m, t, n, last, first=0, q=1, d=1):
        shape = self.Shape.on(self.space.problem.cluster, m, t, n, first=first, last=last, in_flight=q, pipelines=d)
        return shape

    def coeffs(self, m, t, first, last, q, d):
        p = self.space.problem
        a = float(self.cost.stage_time(p.model, p.training, self.stage(m, t, 1, 0)))
        h = float(self.cost.stage_time(p.model, p.training, self.stage(m, t, 0, 1))) if last else 0.0
        cap = p.cluster.machine_memory_bytes[m]
        nmem = int(self.cost.max_layers_fitting(p.model, p.training, self.stage(m, t, 1, last, first, q, d), cap))
        return a, h, nmem

    def pp(self, m, t_next, cross):
        p = self.space.problem
        c = p.cluster
        bw, lat = (p.training and (float(c.inter_bw_gbps), c.inter_latency_us * 1e-6)) if cross else (
            float(c.machine_intra_bw[m]), float(c.machine_intra_lat[m]))
        return float(self.cost.stage_pp_time(p.model, p.training, link_bw_gbps=bw, link_lat_s=lat, t_next=t_next,
                                             bw_next_gbps=c.machine_intra_bw[m], lat_next_s=c.machine_intra_lat[m]))

    def table(self, m, c, lam, first, last, after, d):
        """(least Σ τ + intra-cell T_pp over the grid, index of the stage list that gives it, stage lists)."""
        key = (self.key[m], c, lam, first, last, after, d)
        if key not in self.cache:
            self.cache[key] = self._table(m, c, lam, first, last, after, d)
        return self.cache[key]

    def _table(self, m, c, lam, first, last, after, d):
        best = np.full(len(self.grid), np.inf)
        pick = np.full(len(self.grid), -1)
        shapes = []
        for widths in self.groups[c]:
            if len(widths) > lam:
                continue
            for head in (sorted(set(widths)) if last else [None]):
                order = list(widths)
                if head is not None:
                    order.remove(head)
                    order.append(head)
                cost, counts = self._fill(m, order, lam, first, last, after, d)
                better = cost < best
                best[better] = cost[better]
                pick[better] = len(shapes)
                shapes.append((order, counts))
        return best, pick, shapes

    def _fill(self, m, order, lam, first, last, after, d):
        """Least Σ τ of stages `order` (widths) on machine m holding lam layers, every τ ≤ s."""
        k = len(order)
        coeffs = [self.coeffs(m, t, int(first and i == 0), int(last and i == k - 1), k - i + after, d)
                  for i, t in enumerate(order)]
        a = np.array([x[0] for x in coeffs])
        h = np.array([x[1] for x in coeffs])
        nmem = np.array([x[2] for x in coeffs])
        nmax = np.minimum(nmem[:, None], np.floor((self.grid[None, :] - h[:, None]) / a[:, None] + 1e-9))
        ok = (nmax.min(axis=0) >= 1) & (nmax.sum(axis=0) >= lam)
        counts = np.ones((k, len(self.grid)))
        left = np.full(len(self.grid), float(lam - k))
        for i in np.argsort(a, kind="stable"):
            take = np.clip(np.minimum(nmax[i] - 1, left), 0, None)
            counts[i] += take
            left -= take
        cost = (counts * a[:, None]).sum(axis=0) + h.sum()
        cost += sum(self.pp(m, order[i + 1], False) for i in range(k - 1))
        return np.where(ok, cost, np.inf), counts


def widths_upto(c, widths):
    """Every multiset of TP widths (non-increasing) of at most c devices in all."""
    out = []

    def grow(prefix, left, top):
        if prefix:
            out.append(tuple(prefix))
        for w in widths:
            if w <= min(left, top):
                grow(prefix + [w], left - w, w)
    grow([], c, c)
    return out


def orders(space, limit=None):
    """Machine sequences up to like machines: (first, middle..., last) over subsets of machines,
    one per (first's kind, last's kind, middle kinds as a multiset)."""
    import itertools
    kind = [(m.gpu, m.count, m.intra_bw_gbps) for m in space.problem.cluster.machines]
    seen, out = set(), []
    n = len(kind)
    for k in range(n, 0, -1):  # every machine first: the deadline cuts the small subsets
        for seq in itertools.permutations(range(n), k):
            sig = (kind[seq[0]], kind[seq[-1]], tuple(sorted(kind[m] for m in seq[1:-1])), k)
            if sig not in seen:
                seen.add(sig)
                out.append(seq)
    return out


def machine_values(cells, order, j, kinds, grid_a, grid_b):
    """For machine order[j]: per λ the least n_A·cell_A/s_A + n_B·cell_B/s_B over c_A (pairs of s)."""
    n_a, n_b = kinds
    m, space = order[j], cells.space
    d, last, after = n_a + n_b, int(j == len(order) - 1), len(order) - 1 - j
    cross = 0.0 if last else cells.pp(order[j + 1], 1, True)
    L = space.layers
    values = np.full((L + 1, len(grid_a), len(grid_b)), np.inf)
    choice = np.zeros((L + 1, len(grid_a), len(grid_b)), dtype=int)
    for c_a in range(1, space.counts[m] // n_a + 1):
        c_b = (space.counts[m] - n_a * c_a) // n_b if n_b else 0
        if n_b and c_b < 1:
            continue
        for lam in range(1, L + 1):
            a = cells.table(m, c_a, lam, int(j == 0), last, after, d)[0]
            v = n_a * (a + cross) / cells.grid
            v = v[:, None] if not n_b else v[:, None] + n_b * (cells.table(m, c_b, lam, int(j == 0), last, after, d)[0]
                                                               + cross)[None, :] / cells.grid[None, :]
            better = v < values[lam]
            values[lam][better] = v[better]
            choice[lam][better] = c_a
    return values, choice


def aligned_dp(cells, order, kinds):
    """min over λ (Σ = L) and c_A of Σ_M machine values, for every (s_A, s_B); with the choices."""
    L = cells.space.layers
    nb = len(cells.grid) if kinds[1] else 1
    best = np.full((L + 1, len(cells.grid), nb), np.inf)
    best[0] = 0.0
    trail = []
    for j in range(len(order)):
        values, choice = machine_values(cells, order, j, kinds, cells.grid, cells.grid[:nb])
        new = np.full_like(best, np.inf)
        lam_of = np.zeros(best.shape, dtype=int)
        for total in range(1, L + 1):
            for lam in range(1, total + 1):
                v = best[total - lam] + values[lam]
                better = v < new[total]
                new[total][better] = v[better]
                lam_of[total][better] = lam
        trail.append((lam_of, choice))
        best = new
    return best[L], trail


def aligned_plans(cells, order, kinds, top=8):
    """The plans of the `top` pairs (s_A, s_B) of least fluid T' for this order and kinds."""
    space, grid = cells.space, cells.grid
    n_a, n_b = kinds
    x, trail = aligned_dp(cells, order, kinds)
    sb = grid[None, :] if n_b else np.ones((1, 1))
    rate = n_a / grid[:, None] + (n_b / sb if n_b else 0.0)
    fluid = (space.micro - n_a - n_b + x) / rate
    plans = []
    for flat in np.argsort(fluid, axis=None)[:top]:
        ia, ib = np.unravel_index(flat, fluid.shape)
        if not np.isfinite(fluid[ia, ib]):
            break
        plans.append((float(fluid[ia, ib]), rebuild_aligned(cells, order, kinds, trail, ia, ib)))
    return plans


def rebuild_aligned(cells, order, kinds, trail, ia, ib):
    """The stage lists of the DP's choice at (s_A, s_B): n_A copies of pipeline A, n_B of B."""
    n_a, n_b = kinds
    space, total = cells.space, cells.space.layers
    cells_a, cells_b = [], []
    for j in range(len(order) - 1, -1, -1):
        lam_of, choice = trail[j]
        lam = int(lam_of[total, ia, ib])
        c_a = int(choice[lam, ia, ib])
        m, last, after, d = order[j], int(j == len(order) - 1), len(order) - 1 - j, n_a + n_b
        cells_a.append(cell_stages(cells, m, c_a, lam, j == 0, last, after, d, ia))
        if n_b:
            c_b = (space.counts[m] - n_a * c_a) // n_b
            cells_b.append(cell_stages(cells, m, c_b, lam, j == 0, last, after, d, ib))
        total -= lam
    pipe_a = [s for cell in reversed(cells_a) for s in cell]
    pipe_b = [s for cell in reversed(cells_b) for s in cell]
    return [copy([pipe_a])[0] for _ in range(n_a)] + [copy([pipe_b])[0] for _ in range(n_b)]


def cell_stages(cells, m, c, lam, first, last, after, d, i):
    _, pick, shapes = cells.table(m, c, lam, int(first), last, after, d)
    order, counts = shapes[pick[i]]
    return [[m, t, int(n)] for t, n in zip(order, counts[:, i])]


def enumerate_aligned(space, kinds_list, t_ref, ratio=1.02, top=6, deadline=math.inf):
    """Every order and kinds: the DP's best plans priced exactly; returns [(T, pipes, micro, what)]."""
    lo_hi = steady_range(space, t_ref)
    grid = np.exp(np.arange(math.log(lo_hi[0]), math.log(lo_hi[1]), math.log(ratio)))
    cells = Cells(space, grid)
    found = []
    for order in orders(space):
        for kinds in kinds_list:
            if time.time() > deadline:
                return sorted(found, key=lambda f: f[0])
            if min(space.counts[m] for m in order) < sum(kinds):
                continue
            for fluid, pipes in aligned_plans(cells, order, kinds, top):
                t, micro = space.price(pipes)
                if math.isfinite(t):
                    found.append((t, pipes, micro, f"aligned {kinds} order {order} fluid {fluid:.3f}"))
    return sorted(found, key=lambda f: f[0])


def steady_range(space, t_ref):
    """Periods worth trying, for a plan near t_ref: from 0.8·t_ref/M (every micro-batch in one
    period) to t_ref/8 (a pipeline of fewer than 8 micro-batches is all fill and drain)."""
    return 0.8 * t_ref / space.micro, t_ref / 8
