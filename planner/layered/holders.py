"""bw_min and α_max of §3.4 (docs/cost-model.md): the slowest link and the largest latency
between any two holders of a layer, for one layer or for many at once, on clusters of any size.

Two holders on one machine talk at that machine's intra values (the diagonal of the matrices);
a machine that holds the layer once contributes no diagonal pair.
"""

from __future__ import annotations

import numpy as np


def holders_bw_lat(machines, bw_matrix, lat_matrix):
    """bw_min and α_max over all pairs of holders (one per pipeline) of one layer.

    Two holders on one machine communicate at that machine's intra values (the diagonal);
    a machine that holds the layer for a single pipeline contributes no diagonal pair."""
    machines = np.asarray(machines)
    uniq, counts = np.unique(machines, return_counts=True)
    sub_bw = bw_matrix[np.ix_(uniq, uniq)].copy()
    sub_lat = lat_matrix[np.ix_(uniq, uniq)].copy()
    single = np.flatnonzero(counts < 2)
    sub_bw[single, single] = np.inf
    sub_lat[single, single] = -np.inf
    return float(sub_bw.min()), float(sub_lat.max())


def holders_bw_lat_rows(machines, bw_matrix, lat_matrix, block_elements: int = 1 << 13,
                        max_elements: int = 1 << 22):
    """`holders_bw_lat` for many layers at once: `machines` is (layers, D), one holder per
    pipeline in each row; returns (bw_min, α_max) arrays of length `layers`.

    Pairs (i, j), i ≠ j, of a row give bw[m_i, m_j]: two holders on one machine read that
    machine's intra value off the diagonal, exactly as in `holders_bw_lat`. Rows are taken
    a few at a time (about `block_elements` pairs): small temporaries are reused by the
    allocator, while large ones cost a fresh mapping and its page faults on every call."""
    machines = np.asarray(machines)
    rows, d = machines.shape
    bw_min, lat_max = np.empty(rows), np.empty(rows)
    chunk = max(1, block_elements // (d * d))
    if d * d > max_elements:  # thousands of pipelines: one row at a time on its distinct machines
        for r in range(rows):
            bw_min[r], lat_max[r] = holders_bw_lat(machines[r], bw_matrix, lat_matrix)
        return bw_min, lat_max
    n = bw_matrix.shape[0]
    flat_bw, flat_lat = bw_matrix.ravel(), lat_matrix.ravel()
    for start in range(0, rows, chunk):
        block = machines[start: start + chunk]
        pairs = (block[:, :, None] * n + block[:, None, :]).reshape(len(block), d * d)
        bw = np.take(flat_bw, pairs)
        bw[:, :: d + 1] = np.inf  # i = j is not a pair
        lat = np.take(flat_lat, pairs)
        lat[:, :: d + 1] = -np.inf
        bw_min[start: start + chunk], lat_max[start: start + chunk] = bw.min(axis=1), lat.max(axis=1)
    return bw_min, lat_max


def cluster_holders_bw_lat(cluster, machines, pair_budget: int = 1 << 16):
    """bw_min and α_max [3.4] of each row of holders (layers, D) on `cluster`, whatever its size.

    Small clusters read the dense matrices (`holders_bw_lat_rows`). Large ones read the sparse
    link tables: every pair looked up while there are few (≤ `pair_budget`), else each row's
    extremes from the tables' structure (`PairTable.row_extremes`), never forming D² pairs."""
    machines = np.asarray(machines)
    if cluster.dense_lookup:
        return holders_bw_lat_rows(machines, cluster.bw_matrix, cluster.lat_matrix)
    rows, d = machines.shape
    if rows * d * d <= pair_budget:
        a, b = machines[:, :, None], machines[:, None, :]
        diagonal = np.arange(d)
        bw, lat = cluster.bw_table(a, b), cluster.lat_table(a, b)
        bw[:, diagonal, diagonal], lat[:, diagonal, diagonal] = np.inf, -np.inf  # i = j is not a pair
        return bw.min(axis=(1, 2)), lat.max(axis=(1, 2))
    bw_min = np.array([cluster.bw_table.row_extremes(row, use_max=False) for row in machines])
    lat_max = np.array([cluster.lat_table.row_extremes(row, use_max=True) for row in machines])
    return bw_min, lat_max
