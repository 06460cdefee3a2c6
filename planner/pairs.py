"""One figure (bandwidth or latency) between machines, stored sparsely (docs/plan-space.md §1, docs/vendors.md §8).

`PairTable` holds a default, per-machine rack ids with one figure per rack, and a sorted table
of per-pair overrides, read for arrays of machine pairs at once. A `Bridge` adds the
cross-vendor rule of §8 on top: between an nvidia and an amd machine the figure is joined
with the bridge's (bandwidth: the smaller; latency: the sum), so every reading — pairs,
the dense matrix, a row's extremes — returns the bridged figure and no caller can forget it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

NOT_BRIDGED = -1  # bridge side of a machine whose vendor is `other` (unknown, never bridged)


@dataclass(frozen=True, eq=False)
class Bridge:
    """The cross-vendor link of docs/vendors.md §8 applied to one figure: machines on different
    sides (0 nvidia, 1 amd; NOT_BRIDGED for `other`) get `join(figure, value)`."""

    side: np.ndarray  # (n,) bridge side of each machine
    value: float  # cross_vendor_bw_gbps, or cross_vendor_latency_us in seconds
    join: Literal["min", "add"]  # bandwidth: min(§1 value, bridge); latency: §1 value + bridge

    def crosses(self, mi, mj) -> np.ndarray:
        """Whether machine pairs (mi, mj) cross the bridge (element-wise)."""
        si, sj = self.side[mi], self.side[mj]
        return (si != sj) & (si != NOT_BRIDGED) & (sj != NOT_BRIDGED)

    def apply(self, figure):
        """The bridged figure of a cross-vendor pair whose §1 figure is `figure`."""
        return np.minimum(figure, self.value) if self.join == "min" else figure + self.value


@dataclass(frozen=True, eq=False)
class PairTable:
    """One figure (bandwidth or latency) between machines, stored sparsely (docs/plan-space.md §1):
    the machine's own value on the diagonal, else the pair's override, else the rack's value
    when both machines are in one rack, else the default. Memory O(machines + racks + links)."""

    own: np.ndarray  # (n,) a machine's intra value
    default: float  # between machines with nothing more specific
    rack: np.ndarray  # (n,) rack id of each machine, -1 for none
    rack_value: np.ndarray  # (racks,)
    keys: np.ndarray  # sorted i·n + j (i < j) of the overridden pairs
    values: np.ndarray  # override of each key
    bridge: Bridge | None = None  # §8: set when the cluster mixes nvidia and amd machines

    @property
    def size(self) -> int:
        return len(self.own)

    def __call__(self, mi, mj) -> np.ndarray:
        """The figure for machine pairs (mi, mj), element-wise over broadcast integer arrays."""
        mi, mj = np.asarray(mi, dtype=np.int64), np.asarray(mj, dtype=np.int64)
        out = np.full(np.broadcast_shapes(mi.shape, mj.shape), self.default)
        if len(self.rack_value):
            ri = self.rack[mi]
            same = (ri == self.rack[mj]) & (ri >= 0)
            out = np.where(same, self.rack_value[np.maximum(ri, 0)], out)
        if len(self.keys):
            key = np.minimum(mi, mj) * self.size + np.maximum(mi, mj)
            pos = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
            out = np.where(self.keys[pos] == key, self.values[pos], out)
        if self.bridge is not None:  # never on the diagonal: one machine has one vendor
            out = np.where(self.bridge.crosses(mi, mj), self.bridge.apply(out), out)
        return np.where(mi == mj, self.own[mi], out)

    def dense(self) -> np.ndarray:
        """The n × n matrix (small clusters only)."""
        n = self.size
        out = np.full((n, n), self.default, dtype=float)
        for r in range(len(self.rack_value)):
            members = np.flatnonzero(self.rack == r)
            out[np.ix_(members, members)] = self.rack_value[r]
        i, j = np.divmod(self.keys, n)
        out[i, j] = out[j, i] = self.values
        if self.bridge is not None:
            every = np.arange(n)
            out = np.where(self.bridge.crosses(every[:, None], every[None, :]), self.bridge.apply(out), out)
        np.fill_diagonal(out, self.own)
        return out

    def row_extremes(self, machines: np.ndarray, use_max: bool) -> float:
        """min (or max) of the figure over all pairs of distinct positions of `machines` (one
        holder per pipeline, docs/cost-model.md §3.4): two positions on one machine read its own value.

        With a bridge, the cross-vendor pairs read the bridged figure. The join only moves a
        figure the way the extreme looks (a smaller bandwidth, a larger latency), so the
        extreme is that of the §1 figures or the bridged extreme of the cross pairs."""
        plain = self._plain_extremes(machines, use_max)
        if self.bridge is None:
            return plain
        if use_max != (self.bridge.join == "add"):
            raise ValueError("bridged row extremes exist for the smallest bandwidth and the largest latency only")
        u = np.unique(machines)
        side = self.bridge.side[u]
        a, b = u[side == 0], u[side == 1]
        if not len(a) or not len(b):
            return plain
        cross = float(self.bridge.apply(self._between_extreme(a, b, use_max)))
        return max(plain, cross) if use_max else min(plain, cross)

    def _between_extreme(self, a: np.ndarray, b: np.ndarray, use_max: bool) -> float:
        """min (or max) of the §1 figure over the pairs (x in a, y in b) of two disjoint sets of
        distinct machines, counted like `_plain_extremes`: overridden pairs (each seen), pairs
        inside one rack (present unless all overridden), the rest at the default."""
        found, cross_hits, same_rack_pairs = [np.zeros(0)], 0, 0
        x = y = np.zeros(0, dtype=np.int64)
        if len(self.keys):
            in_a, in_b = np.zeros(self.size, dtype=bool), np.zeros(self.size, dtype=bool)
            in_a[a], in_b[b] = True, True
            x, y = np.divmod(self.keys, self.size)
            hit = (in_a[x] & in_b[y]) | (in_b[x] & in_a[y])
            found.append(self.values[hit])
            x, y = x[hit], y[hit]
            cross_hits = len(x)
        if len(self.rack_value):
            racks = len(self.rack_value)
            per_a = np.bincount(self.rack[a][self.rack[a] >= 0], minlength=racks)
            per_b = np.bincount(self.rack[b][self.rack[b] >= 0], minlength=racks)
            inside = per_a * per_b
            same_rack_pairs = int(inside.sum())
            rx = self.rack[x]
            same = (rx >= 0) & (rx == self.rack[y])
            found.append(self.rack_value[inside > np.bincount(rx[same], minlength=racks)])
            cross_hits -= int(same.sum())
        if len(a) * len(b) - same_rack_pairs > cross_hits:
            found.append(np.array([self.default]))
        values = np.concatenate(found)
        return float(values.max() if use_max else values.min())

    def _plain_extremes(self, machines: np.ndarray, use_max: bool) -> float:
        """`row_extremes` of the §1 figures (no bridge).

        Exact without forming the pairs: the pairs of distinct machines fall into overridden
        ones (each seen), same-rack ones (the rack's value, present unless every such pair of
        the rack is overridden) and the rest (the default, likewise). O(D log D + links)."""
        u, counts = np.unique(machines, return_counts=True)
        found = [self.own[u[counts > 1]]]
        if len(u) > 1:
            pairs = len(u) * (len(u) - 1) // 2
            hits = np.zeros(0, dtype=np.int64)
            if len(self.keys):
                member = np.zeros(self.size, dtype=bool)
                member[u] = True
                a, b = np.divmod(self.keys, self.size)
                hits = np.flatnonzero(member[a] & member[b])
                found.append(self.values[hits])
                a, b = a[hits], b[hits]
            same_rack_pairs = 0
            if len(self.rack_value):
                racks, per = np.unique(self.rack[u][self.rack[u] >= 0], return_counts=True)
                inside = per * (per - 1) // 2
                same_rack_pairs = int(inside.sum())
                hit_rack = self.rack[a] if len(hits) else np.zeros(0, dtype=np.int64)
                hit_rack = hit_rack[(hit_rack >= 0) & (hit_rack == self.rack[b])] if len(hits) else hit_rack
                overridden = np.bincount(hit_rack, minlength=len(self.rack_value))[racks]
                found.append(self.rack_value[racks[inside > overridden]])
                cross_hits = len(hits) - len(hit_rack)
            else:
                cross_hits = len(hits)
            if pairs - same_rack_pairs > cross_hits:
                found.append(np.array([self.default]))
        values = np.concatenate(found)
        if not len(values):
            return -np.inf if use_max else np.inf
        return float(values.max() if use_max else values.min())



    def toward(self, sources: np.ndarray, targets: np.ndarray, use_max: bool) -> np.ndarray:
        """Per machine of `sources`: min (or max) of the figure to the machines of `targets`
        (two disjoint arrays of distinct machines, targets non-empty), bridged like
        `row_extremes`. Counted from the structure like `_plain_extremes`: O(S + T + links) where
        the pairs are S·T (idle machines against 2,000 in use on 10^5 GPUs: 24M pairs, 5 s)."""
        plain = self._plain_toward(sources, targets, use_max)
        if self.bridge is None:
            return plain
        if use_max != (self.bridge.join == "add"):
            raise ValueError("bridged extremes exist for the smallest bandwidth and the largest latency only")
        reduce = np.maximum if use_max else np.minimum
        for side in (0, 1):
            mine, theirs = self.bridge.side[sources] == side, targets[self.bridge.side[targets] == 1 - side]
            if mine.any() and len(theirs):
                bridged = self.bridge.apply(self._plain_toward(sources[mine], theirs, use_max))
                plain[mine] = reduce(plain[mine], bridged)
        return plain

    def _plain_toward(self, sources: np.ndarray, targets: np.ndarray, use_max: bool) -> np.ndarray:
        """`toward` of the §1 figures: per source, the overridden pairs to a target (each seen),
        its rack's value when some same-rack target is not overridden, and the default when
        some other target is not."""
        n, reduce = self.size, (np.maximum if use_max else np.minimum)
        found = np.full(len(sources), -np.inf if use_max else np.inf)
        index = np.full(n, -1)
        index[sources] = np.arange(len(sources))
        is_target = np.zeros(n, dtype=bool)
        is_target[targets] = True
        keyed_same, keyed_other = np.zeros(len(sources), dtype=np.int64), np.zeros(len(sources), dtype=np.int64)
        x, y = np.divmod(self.keys, n)
        for a, b in ((x, y), (y, x)):  # a key is one unordered pair: a source at either end
            hit = (index[a] >= 0) & is_target[b]
            src, ra, rb = index[a[hit]], self.rack[a[hit]], self.rack[b[hit]]
            reduce.at(found, src, self.values[hit])
            same = (ra >= 0) & (ra == rb)
            np.add.at(keyed_same, src[same], 1)
            np.add.at(keyed_other, src[~same], 1)
        rack = self.rack[sources]
        same_rack = np.zeros(len(sources), dtype=np.int64)
        if len(self.rack_value):
            target_racks = self.rack[targets]
            per_rack = np.bincount(target_racks[target_racks >= 0], minlength=len(self.rack_value))
            same_rack = np.where(rack >= 0, per_rack[np.maximum(rack, 0)], 0)
            found = np.where(same_rack > keyed_same, reduce(found, self.rack_value[np.maximum(rack, 0)]), found)
        return np.where(len(targets) - same_rack > keyed_other, reduce(found, self.default), found)

    def apart_extreme(self, machines: np.ndarray, colours: np.ndarray, use_max: bool) -> float:
        """min (or max) of the figure over the pairs of two distinct `machines` (unique) of
        different colours (non-negative ints), bridged like `row_extremes`; ±inf when there is
        no such pair. Counted from the structure like `_plain_extremes`: O(U log U + links)
        where the pairs are U² (the sequence T_dp across replicas of 100k GPUs)."""
        plain = self._apart_between(machines, colours, machines, colours, use_max)
        if self.bridge is None:
            return plain
        if use_max != (self.bridge.join == "add"):
            raise ValueError("bridged apart extremes exist for the smallest bandwidth and the largest latency only")
        side = self.bridge.side[machines]
        a, b = side == 0, side == 1
        cross = self._apart_between(machines[a], colours[a], machines[b], colours[b], use_max)
        if not np.isfinite(cross):
            return plain
        bridged = float(self.bridge.apply(cross))
        return max(plain, bridged) if use_max else min(plain, bridged)

    def _apart_between(self, a: np.ndarray, ca: np.ndarray, b: np.ndarray, cb: np.ndarray, use_max: bool) -> float:
        """min (or max) of the §1 figure over the ordered pairs (x in a, y in b) of different
        colours: overridden pairs (each seen), pairs inside one rack (its value, present unless
        every such pair is overridden), the rest at the default (likewise)."""
        racks = len(self.rack_value)
        found, keyed_rack, keyed_other = [np.zeros(0)], np.zeros(racks, dtype=np.int64), 0
        if len(self.keys):
            values, rack_of = self._keyed_apart(a, ca, b, cb)
            found.append(values)
            keyed_rack = np.bincount(rack_of[rack_of >= 0], minlength=racks)
            keyed_other = int((rack_of < 0).sum())
        inside = np.zeros(racks, dtype=np.int64)
        if racks:
            ra, rb = self.rack[a], self.rack[b]
            inside = np.bincount(ra[ra >= 0], minlength=racks) * np.bincount(rb[rb >= 0], minlength=racks)
            top = int(max(ca.max(initial=0), cb.max(initial=0))) + 1
            common, products = _matching(ra[ra >= 0] * top + ca[ra >= 0], rb[rb >= 0] * top + cb[rb >= 0])
            inside = inside - np.bincount(common // top, weights=products, minlength=racks).astype(np.int64)
            found.append(self.rack_value[inside > keyed_rack])
        total = len(a) * len(b) - int(_matching(ca, cb)[1].sum())
        if total - int(inside.sum()) > keyed_other:
            found.append(np.array([self.default]))
        values = np.concatenate(found)
        if not len(values):
            return -np.inf if use_max else np.inf
        return float(values.max() if use_max else values.min())

    def _keyed_apart(self, a: np.ndarray, ca: np.ndarray, b: np.ndarray, cb: np.ndarray):
        """The overridden ordered pairs (x in a, y in b) of different colours: their values and
        the rack they share (−1: none)."""
        colour_a, colour_b = np.full(self.size, -1), np.full(self.size, -1)
        colour_a[a], colour_b[b] = ca, cb
        x, y = np.divmod(self.keys, self.size)
        forward = (colour_a[x] >= 0) & (colour_b[y] >= 0) & (colour_a[x] != colour_b[y])
        backward = (colour_a[y] >= 0) & (colour_b[x] >= 0) & (colour_a[y] != colour_b[x])
        hit = np.concatenate([np.flatnonzero(forward), np.flatnonzero(backward)])
        rx, ry = self.rack[x[hit]], self.rack[y[hit]]
        return self.values[hit], np.where((rx >= 0) & (rx == ry), rx, -1)


def _matching(ka: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys found in both arrays and, per key, (count in ka) × (count in kb)."""
    ua, na = np.unique(ka, return_counts=True)
    ub, nb = np.unique(kb, return_counts=True)
    common, ia, ib = np.intersect1d(ua, ub, assume_unique=True, return_indices=True)
    return common, na[ia] * nb[ib]
