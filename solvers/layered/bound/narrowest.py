"""[U14] The narrowest holder: every layer syncs at the least width among its holders (docs/bounds.md §6).

A layer's D holders all sync its gradient in one ring, whose largest shard is P(ℓ)/t_min(ℓ)
(docs/cost-model.md §3.4): each holder pays for the *narrowest* holder's shard, not its own. The
usage tables price each relaxed pipeline alone, so a stage is floored at its own width.

Let W be, over the D pipelines, the least of each pipeline's widest stage. The pipeline that sets
W holds every layer (and the head) on stages of width ≤ W, so t_min(ℓ) ≤ W for every layer: every
stage of width t > W syncs at least what its class's type of width W pays, the floors of §3.4 at
P(ℓ)/W (the ring's bw_min and α_max are floored the same way for both). And every pipeline has a
stage of width ≥ W. So, for a run of the types' widths [w_lo … w_hi], the case W in it has (a) the
sync floors of every type wider than w_hi raised to those of its class's width-w_hi type
(`narrowed_types`) and (b) only pipelines with a stage of t ≥ w_lo in the tables
(`usage.wide_prefix_table`). Every plan is in the case of its own W, so a threshold refuted in
the cases of runs that cover every width is refuted. The whole run is the test without the split;
a run left open is halved (`SyncLevelSplit._widths_refuted`), down to single widths.

Why (b): without it the case of the widest w is the test without the split. Why it pays: on
h800-h20-16-24 (70B, D = 2) the relaxed plan pairs a pipeline of fourteen t = 1 H800 stages with
H20 stages of t = 8 holding 30 layers each, priced at 0.26 s of sync where the real ring, at
t_min = 1, takes ≥ 1.7 s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from solvers.layered.bound.classes import ClassTypes

SYNC_FLOORS = ("sync_layer", "sync_head", "crossing_layer", "crossing_head")


def case_widths(types: ClassTypes) -> tuple[int, ...]:
    """The widths W can take: those of the types, least first."""
    return tuple(sorted({int(t) for t in types.tp}))


class WidthCase(NamedTuple):
    """The tables of a case W ∈ [least, most] of a run of widths: only pipelines with a stage of
    t ≥ `wide_from`, floors at width `narrow_to` (0: that side constrains nothing)."""

    wide_from: int
    narrow_to: int


def width_case(types: ClassTypes, widths: tuple[int, ...]) -> WidthCase:
    """The case W ∈ `widths` (a run of the types' widths, least first; (0,): any W): a stage of t ≥
    its least in every pipeline unless that is the least width, floors at its largest unless that
    is the largest (the whole run is the test without the split, and shares its tables)."""
    least, most = widths[0], widths[-1]
    return WidthCase(wide_from=least if least > types.tp.min() else 0,
                     narrow_to=most if 0 < most < types.tp.max() else 0)


def narrowed_types(types: ClassTypes, w: int) -> ClassTypes:
    """`types` where t_min ≤ w for every layer: each type wider than w syncs at least as its
    class's type of width w (left as it is where its class has none: still a floor)."""
    floors = {name: getattr(types, name).copy() for name in SYNC_FLOORS}
    for i in np.flatnonzero(types.tp > w):
        same = np.flatnonzero((types.cls == types.cls[i]) & (types.tp == w))
        if not len(same):
            continue  # the class has no type of width w: nothing narrower to raise it to
        for values in floors.values():
            values[i] = max(values[i], values[same[0]])
    return replace(types, **floors)
