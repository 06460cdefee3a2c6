"""[U15] Local layers of a shared class: at most the fewest any pipeline holds there (docs/bounds.md §6).

[U10] counts a class as shared when every pipeline has a device on one of its machines; its
stages are then not capped as crossing. But a layer is local (its ring stays on one machine)
only if *every* pipeline holds it on that machine, so a stage of class k holds at most μ_k local
layers, μ_k the fewest layers any pipeline holds on class k. The rest of its n layers cross:
it syncs at least n·s + max(0, n − μ_k)·(c − s) (s, c: its type's own and crossing floors per
layer, c ≥ s). A relaxed plan escapes [U10]'s caps by giving one pipeline a single one-layer
stage on the class (h800-h20-16-32, D = 3: an H800 pipeline with one layer on two H20s, beside
H20 stages of 40 layers that then count as local).

For a cell μ_k ∈ [m_lo, m_hi]: every class-k type holds at most the n whose sync above stays
below ω with μ_k = m_hi (`local_capped_types`), and every pipeline holds ≥ m_lo layers on class
k, so it has at least ⌈m_lo / ρ_k(b)⌉ of its devices (`with_layers_on`). ρ_k(b), the most layers
one device of the class holds in a stage whose τ ≤ b, is per breakpoint: a table entry at b only
has stages with τ ≤ b, and those hold n ≤ (b − head)/τ_layer layers as well as the memory caps
(h800-h20-16-24, D = 2: at b = 0.294 s an H20 device holds 0.625 layers, by memory alone 10, so
a pipeline holding 8 layers there needs 13 H20s, not 1). The cells cover 0 … L, so a case refuted
in every cell is refuted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from solvers.layered.bound.classes import ClassTypes
from solvers.layered.bound.pricing import ROLES, layer_limits
from solvers.layered.bound.usage import UsageTable

CELL_EDGES = (0, 1, 2, 4, 8, 16, 32)  # μ_k cells [e_j, e_{j+1} − 1], the last up to L


def cells(layers: int) -> list[tuple[int, int]]:
    """The cells (m_lo, m_hi) of μ_k, 0 … L."""
    edges = [e for e in CELL_EDGES if e < layers] + [layers + 1]
    return [(lo, hi - 1) for lo, hi in zip(edges, edges[1:])]


def local_capped_types(types: ClassTypes, k: int, most_local: int, omega: float) -> ClassTypes:
    """`types` with every class-k type's layers capped where its sync, with at most `most_local`
    of them local, reaches ω: n·s + max(0, n − most_local)·(c − s) (+ the head's own floor on a
    last stage) < ω, to 10⁻⁹ relative (lenient)."""
    caps = types.caps.copy()
    n = np.arange(types.layers + 1)
    for i in np.flatnonzero(types.cls == k):
        s, c = types.sync_layer[i], max(types.crossing_layer[i], types.sync_layer[i])
        sync = n * s + np.maximum(0, n - most_local) * (c - s)
        for last in (0, 1):
            fits = sync + (types.sync_head[i] if last else 0.0) < omega * (1 + 1e-9)
            caps[i, :, last] = np.minimum(caps[i, :, last], int(np.flatnonzero(fits).max(initial=0)))
    return replace(types, caps=caps)


def layers_per_device(types: ClassTypes, k: int, b: np.ndarray) -> np.ndarray:
    """[K] ρ_k(b): the most layers one device of class k holds in a stage of τ ≤ b[j], over its
    types and roles (the layer limits of time and memory, over t)."""
    mine = np.flatnonzero(types.cls == k)
    if not len(mine):
        return np.zeros(len(b))
    most = np.max([layer_limits(types, b, role)[:, mine] for role in ROLES], axis=0)  # [K, mine]
    return (most / types.tp[mine][None, :]).max(axis=1)


def with_layers_on(table: UsageTable, k: int, fewest_layers: int, rho: np.ndarray) -> UsageTable:
    """`table` without the entries whose usage has too few class-k devices to hold
    `fewest_layers` layers at their breakpoint: u_k·ρ_k(b) < `fewest_layers` (`rho`: [K])."""
    if fewest_layers <= 0:
        return table
    on_class = np.unravel_index(np.arange(int(np.prod(table.dims))), table.dims)[k]
    # [K, U]; lenient by 1e-9: a usage whose u_k·ρ_k(b) meets the count only up to rounding stays
    short = on_class[None, :] * rho[:, None] < fewest_layers * (1 - 1e-9)
    drop = lambda a: None if a is None else np.where(short, np.float32(np.inf), a)  # noqa: E731
    return replace(table, least=drop(table.least), crossing=drop(table.crossing), runs={}, hints={})
