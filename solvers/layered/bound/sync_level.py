"""[U11] One T_dp for the whole plan, against the classes no pipeline shares (docs/bounds.md §6).

A plan's T = max_p T_pipe(p) + T_dp with one T_dp for all its pipelines (docs/cost-model.md §3.4),
the largest sync of any stage. The usage tables floor each pipeline's own sync only ([U4]). For a
level ω every plan with D pipelines is in one of two cases:

- T_dp ≥ ω: every pipeline runs within v − ω with no sync at all, so each usage's bubble is at
  least max(its own table's, the bare table's + ω) — [U2] (with [U9]/[U10]) on that table;
- T_dp < ω: every stage syncs below ω. In a case of [U10], a stage of a class with no shared
  machine crosses, so it holds fewer than n layers where n·crossing_layer (+ crossing_head if
  last) reaches ω: the class's types get those layer caps. [U10]'s test of that case runs on a
  table built with them (the largest of the tables capped one class at a time: each is below the
  table capped on all, so their maximum is still a lower bound).

A threshold is refuted when, at the least level ω whose first case refutes, every case of the
second refutes. Levels are a few fixed shares of the trivial bound, so that a bisection reuses
the capped tables it built. The second case may also be refuted level by level with [U12]
(`aligned.py`): T_dp in [ω_i, ω_{i+1}) for the levels below ω (and 0), each with the lift ω_i
and the crossing layers ω_{i+1} allows; it needs no table of its own, so it runs first, and for
a D with only the bare table ([U5]) it is the only second case.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from solvers.layered.bound import integer
from solvers.layered.bound.aligned import AlignedTest
from solvers.layered.bound.classes import ClassTypes
from solvers.layered.bound.usage import UsageTable, usage_tables

LEVEL_SHARES = (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)  # levels ω, as shares of the trivial bound, least first


@dataclass
class SyncLevelSplit:
    """[U11] for one D on the usage route: its own table (None: the bare table alone; without
    crossing parts: no [U10] cases) and a bare table; [U12] beside it."""

    types: ClassTypes
    b: np.ndarray
    own: UsageTable | None
    bare: UsageTable
    micro: int
    levels: tuple[float, ...]
    deadline: float
    rent: integer.Rent | None = None
    capped: dict[tuple[float, int], UsageTable] = field(default_factory=dict, repr=False)  # one level's, by class
    combined: dict[tuple[float, tuple[int, ...]], UsageTable] = field(default_factory=dict, repr=False)  # by unshared set
    hint: integer.Shared | None = None  # the case that held last
    aligned: AlignedTest | None = field(default=None, repr=False)  # [U12], built at its first use

    def refuted(self, threshold: float) -> bool:
        """True when no plan with D pipelines has T ≤ `threshold` by the split on T_dp's level."""
        for omega in self.levels:
            if time.perf_counter() > self.deadline:
                return False  # refutes nothing more (each level is an integer programme or more)
            if integer.refuted(self._above(omega), self.types.pipelines, self.micro, threshold, self.rent):
                return self._aligned_below(omega, threshold) or self._below_refuted(omega, threshold)
        return False

    def _above(self, omega: float) -> UsageTable:
        """The own table where T_dp ≥ ω: no usage's bubble below the bare one's + ω."""
        lifted = self.bare.least + np.float32(omega)
        if self.own is None:
            return replace(self.bare, least=lifted, runs={}, hints={})
        crossing = None if self.own.crossing is None else np.maximum(self.own.crossing, lifted)
        return replace(self.own, least=np.maximum(self.own.least, lifted), crossing=crossing, runs={}, hints={})

    def _aligned_below(self, omega: float, threshold: float) -> bool:
        """[U12] on every interval [ω_i, ω_{i+1}) of the levels below ω, from 0."""
        if self.aligned is None:
            self.aligned = AlignedTest.of(self.types, self.b, self.micro, self.deadline)
        edges = [0.0] + [w for w in self.levels if w < omega] + [omega]
        return all(self.aligned.refuted(threshold, lo, hi) for lo, hi in zip(edges, edges[1:]))

    def _below_refuted(self, omega: float, threshold: float) -> bool:
        """Every case of [U10] refuted where T_dp < ω (layers capped on the classes it does not share)."""
        if self.own is None or self.own.crossing is None:
            return False  # no crossing parts to split by
        d = self.types.pipelines
        for case in sorted(integer.class_sets(self.own, d), key=lambda case: case != self.hint):
            table = self._capped_table(omega, [k for k, c in enumerate(case.count) if c == 0])
            if table is None or not integer.refuted_in_case(table, case, d, self.micro, threshold, self.rent):
                self.hint = case
                return False
        return True

    def _capped_table(self, omega: float, unshared: list[int]) -> UsageTable | None:
        """The own table with the layers of every class in `unshared` capped below ω's crossing
        sync: the largest of the tables capped one class at a time (None: past the deadline)."""
        if not unshared:
            return self.own
        key = (omega, tuple(unshared))
        if key not in self.combined:  # many cases share an unshared set; a bisection tests each often
            each = [self._capped_one(omega, k) for k in unshared]
            if any(t is None for t in each):
                return None
            self.combined[key] = replace(each[0], least=np.max([t.least for t in each], axis=0),
                                         crossing=np.max([t.crossing for t in each], axis=0), runs={}, hints={})
        return self.combined[key]

    def _capped_one(self, omega: float, k: int) -> UsageTable | None:
        """The own table of types whose class-k stages sync below ω across machines (kept for one
        level at a time: a bisection mostly stays at one)."""
        if (omega, k) not in self.capped:
            for store in (self.capped, self.combined):
                for key in [key for key in store if key[0] != omega]:
                    del store[key]
            d = self.types.pipelines
            built = usage_tables({d: capped_types(self.types, k, omega)}, self.b, self.deadline, own={d})
            if built is None:
                return None
            self.capped[(omega, k)] = built[d]
        return self.capped[(omega, k)]


def capped_types(types: ClassTypes, k: int, omega: float) -> ClassTypes:
    """`types` with every class-k type's layers capped where its crossing sync reaches ω:
    n·crossing_layer (+ crossing_head on a last stage) < ω (to 10⁻⁹ relative, lenient)."""
    caps = types.caps.copy()
    for i in np.flatnonzero(types.cls == k):
        if types.crossing_layer[i] <= 0:
            continue  # nothing syncs (D = 1)
        for last in (0, 1):
            room = omega - (types.crossing_head[i] if last else 0.0)
            caps[i, :, last] = np.minimum(caps[i, :, last], max(0, int(np.floor(room / types.crossing_layer[i] * (1 + 1e-9)))))
    return replace(types, caps=caps)
