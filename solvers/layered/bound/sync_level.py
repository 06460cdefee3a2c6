"""[U11] One T_dp for the whole plan, against the classes no pipeline shares (docs/bounds.md §6).

A plan's T = max_p T_pipe(p) + T_dp with one T_dp for all its pipelines (docs/cost-model.md §3.4),
the largest sync of any stage. The usage tables floor each pipeline's own sync only ([U4]). For a
level ω every plan with D pipelines is in one of two cases:

- T_dp ≥ ω: every pipeline runs within v − ω with no sync at all, so each usage's bubble is at
  least max(its own table's, the bare table's + ω) — [U2] (with [U9]/[U10]) on that table;
- T_dp < ω: every stage syncs below ω. In a case of [U10], a stage of a class with no shared
  machine crosses, so it holds fewer than n layers where n·crossing_layer (+ crossing_head if
  last) reaches ω: the class's types get those layer caps.

A threshold is refuted when, at the least level ω whose first case refutes, the second case does,
one interval [ω_i, ω_{i+1}) of the levels below ω (and 0) at a time ([U13]): there T_dp is below
ω_{i+1} *and* at least ω_i, so [U10]'s test of each case runs on the own table with the caps of
ω_{i+1} lifted to the bare table's + ω_i. The caps: every type's by its own sync floor ([U4]
holds for any stage of a type, shared class or not), and the crossing ones of the classes the
case does not share (the largest of the tables capped one such class at a time: each is below
the table capped on all, so their maximum is still a lower bound). Where the caps alone
(ω_i = 0, as [U11] first had it) or the lift alone (the first case at ω_i) leave a relaxed plan,
both together may not. An interval left open is halved at √(ω_i·ω_{i+1}) while its halves span
more than MIN_RATIO: the lift and the caps, its two ends, are nearer in each half. On the levels'
intervals [U12] (`aligned.py`) is tried first; it needs no table of its own, so for a D with only
the bare table ([U5]) it is the only test below ω. Levels are a few fixed shares of the trivial
bound, so that a bisection reuses the capped tables it built.

With `extended`, each interval's cases run for every W of [U14] (`narrowest.py`: floors at the
narrowest holder's width, only pipelines with a stage that wide): first for the run of all widths
(the test without the split), then for each half of a run left open, down to single widths. A
case they leave open is tried again per cell of μ_k, the fewest layers any pipeline holds on a
class the case shares ([U15], `local_layers.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from solvers.layered.bound import integer
from solvers.layered.bound.aligned import AlignedTest
from solvers.layered.bound.classes import ClassTypes
from solvers.layered.bound.local_layers import cells, layers_per_device, local_capped_types, with_layers_on
from solvers.layered.bound.narrowest import WidthCase, case_widths, narrowed_types, width_case
from solvers.layered.bound.usage import UsageTable, usage_tables

LEVEL_SHARES = (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)  # levels ω, as shares of the trivial bound, least first
MIN_RATIO = 1.05  # an interval [lo, hi) left open is halved (at √(lo·hi)) while its halves span more than this
CAPPED_BYTES = 1.0e9  # capped tables kept across levels (float32; one level's are kept whatever their size)


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
    kept: dict[tuple, UsageTable] = field(default_factory=dict, repr=False)  # capped tables, oldest first
    hint: dict = field(default_factory=dict)  # interval → the case of [U10] that held there last
    open_interval: tuple[float, float, bool] | None = None  # the interval that held last (lo, hi, with [U12])
    aligned: AlignedTest | None = field(default=None, repr=False)  # [U12], built at its first use
    extended: bool = False  # [U14] and [U15] too (the search turns them on once [U13] alone has settled)

    def refuted(self, threshold: float) -> bool:
        """True when no plan with D pipelines has T ≤ `threshold` by the split on T_dp's level."""
        for omega in self.levels:
            if time.perf_counter() > self.deadline:
                return False  # refutes nothing more (each level is an integer programme or more)
            if integer.refuted(self._above(omega), self.types.pipelines, self.micro, threshold, self.rent):
                return self._below_refuted(omega, threshold)
        return False

    def _above(self, omega: float) -> UsageTable:
        """The own table where T_dp ≥ ω: no usage's bubble below the bare one's + ω."""
        if self.own is None:
            return replace(self.bare, least=self.bare.least + np.float32(omega), runs={}, hints={})
        return self._lifted(self.own, omega)

    def _lifted(self, table: UsageTable, omega: float) -> UsageTable:
        """`table` where T_dp ≥ ω: each entry at least the bare one's + ω (T ≥ T_pipe + T_dp)."""
        lifted = self.bare.least + np.float32(omega)
        crossing = None if table.crossing is None else np.maximum(table.crossing, lifted)
        return replace(table, least=np.maximum(table.least, lifted), crossing=crossing, runs={}, hints={})

    def extend(self) -> None:
        """Turn [U14] and [U15] on. The hints of [U13] alone are dropped: the case they name is the
        test without the split, which held there and would stop the new one at once."""
        self.extended, self.hint = True, {}

    def _below_refuted(self, omega: float, threshold: float) -> bool:
        """T_dp < ω: every interval [ω_i, ω_{i+1}) of the levels below ω, from 0, refuted. The
        interval left open last is tried first: a threshold that is not refuted usually stops there."""
        last, done = self.open_interval, set()
        if last is not None and last[1] <= omega:
            if not self._interval_tests(threshold, *last):
                return False
            done.add(last[:2])  # refuted: the walk does not test it again
        edges = [0.0] + [w for w in self.levels if w < omega] + [omega]
        return all(self.interval_refuted(threshold, lo, hi, done=done) for lo, hi in zip(edges, edges[1:]))

    def interval_refuted(self, threshold: float, lo: float, hi: float, aligned: bool = True,
                         done: frozenset | set = frozenset()) -> bool:
        """True when no plan with D pipelines, T ≤ `threshold` and T_dp in [lo, hi) exists: by the
        tests of the interval, or of both its halves (at √(lo·hi): the lift and the caps, the
        interval's two ends, are nearer in each) while they span more than MIN_RATIO. [U12] runs on
        the levels' intervals only (`aligned`): its layouts cost seconds each on hetero-1. `done`:
        intervals already refuted at this threshold."""
        if (lo, hi) in done or self._interval_tests(threshold, lo, hi, aligned):
            return True
        mid = float(np.sqrt(lo * hi))
        if lo <= 0 or mid / lo < MIN_RATIO or time.perf_counter() > self.deadline:
            self.open_interval = (lo, hi, aligned)
            return False
        return (self.interval_refuted(threshold, mid, hi, aligned=False, done=done)
                and self.interval_refuted(threshold, lo, mid, aligned=False, done=done))

    def _interval_tests(self, threshold: float, lo: float, hi: float, aligned: bool = True) -> bool:
        """[U12]'s alignment (where `aligned`), or every case of [U10] on the own table with every
        type's layers capped below `hi` by its own sync floor (those of the classes the case does not
        share by the crossing one) and every entry lifted to the bare one's + `lo` (both hold in the
        interval)."""
        if aligned and self.aligned is None:
            self.aligned = AlignedTest.of(self.types, self.b, self.micro, self.deadline)
        return (aligned and self.aligned.refuted(threshold, lo, hi)) or self._cases_refuted(threshold, lo, hi)

    def _cases_refuted(self, threshold: float, lo: float, hi: float) -> bool:
        """Every case of [U10] refuted where T_dp lies in [lo, hi), for every W of [U14]. The run of
        widths left open last is tried first: a threshold that stands costs one test. That run is
        one the halving could not split (`_widths_refuted`): a run that stood but whose halves were
        then refuted says nothing (the whole run is the test without the split, which stands
        wherever [U14] is needed: taking it as the open run cut h800-h20-16-24's D = 2 short at
        67.8166 s where the split refutes 67.9523 s)."""
        if self.own is None or self.own.crossing is None:
            return False  # no crossing parts to split by
        last = self.hint.get((lo, hi, "width"))
        if last is not None and not self._width_refuted(threshold, lo, hi, last):
            return False
        return self._widths_refuted(threshold, lo, hi, case_widths(self.types) if self.extended else (0,))

    def _widths_refuted(self, threshold: float, lo: float, hi: float, widths: tuple[int, ...]) -> bool:
        """The cases of W in `widths` (a run of the types' widths, least first) refuted: all at
        once, else each half of the run (the half with the run left open last first). A run
        that stands and cannot be halved is kept as the one left open."""
        if self._width_refuted(threshold, lo, hi, widths):
            return True
        if len(widths) < 2 or time.perf_counter() > self.deadline:
            self.hint[(lo, hi, "width")] = widths
            return False
        last = set(self.hint.get((lo, hi, "width"), ()))
        halves = sorted((widths[:len(widths) // 2], widths[len(widths) // 2:]), key=lambda h: not last & set(h))
        return all(self._widths_refuted(threshold, lo, hi, half) for half in halves)

    def _width_refuted(self, threshold: float, lo: float, hi: float, widths: tuple[int, ...]) -> bool:
        """Every case of [U10] refuted where T_dp lies in [lo, hi) and W in `widths` ((0,): any W)."""
        d, w = self.types.pipelines, width_case(self.types, widths)
        for case in sorted(integer.class_sets(self.own, d), key=lambda case: case != self.hint.get((lo, hi, w))):
            unshared = [k for k, c in enumerate(case.count) if c == 0]
            table = self._case_table(lo, hi, unshared, w)
            if table is None or not (integer.refuted_in_case(table, case, d, self.micro, threshold, self.rent)
                                     or (self.extended and self._local_refuted(threshold, lo, hi, w, case))):
                self.hint[(lo, hi, w)] = case
                return False
        return True

    def _local_refuted(self, threshold: float, lo: float, hi: float, w: WidthCase, case: integer.Shared) -> bool:
        """[U15]: for some class the case shares, every cell of μ_k (the fewest layers any pipeline
        holds on it) refuted, the cell that held last first."""
        d, unshared = self.types.pipelines, [k for k, c in enumerate(case.count) if c == 0]
        for k in (k for k, c in enumerate(case.count) if c > 0):
            rho, key = layers_per_device(self.types, k, self.b), (lo, hi, w, case, k)
            for m_lo, m_hi in sorted(cells(self.types.layers), key=lambda cell: cell != self.hint.get(key)):
                table = self._case_table(lo, hi, unshared, w, local=(k, m_hi))
                if table is None or not integer.refuted_in_case(with_layers_on(table, k, m_lo, rho), case, d,
                                                                self.micro, threshold, self.rent):
                    self.hint[key] = (m_lo, m_hi)
                    break
            else:
                return True
        return False

    def _case_table(self, lo: float, hi: float, unshared: list[int], w: WidthCase,
                    local: tuple[int, int] | None = None) -> UsageTable | None:
        """The capped table of `unshared` below `hi` where W = w (and [U15]'s `local`: class k with
        μ_k ≤ m), lifted by `lo` (None: past the deadline)."""
        capped = self._capped_table(hi, unshared, w, local)
        if capped is None or lo == 0:
            return capped  # the capped own table is already above the bare one
        key = ("lifted", hi, lo, tuple(unshared), w, local)
        if key not in self.kept:  # a bisection tests each often
            self._keep(key, hi, self._lifted(capped, lo))
        return self.kept[key]

    def _capped_table(self, omega: float, unshared: list[int], w: WidthCase,
                      local: tuple[int, int] | None = None) -> UsageTable | None:
        """The own table where W = w with every type's layers capped below ω by its own sync floor,
        and those of every class in `unshared` by the crossing one: the largest of the tables
        capped one such class at a time (None: past the deadline)."""
        if not unshared:
            return self._capped_one(omega, None, w, local)
        key = ("combined", omega, tuple(unshared), w, local)
        if key not in self.kept:  # many cases share an unshared set
            each = [self._capped_one(omega, k, w, local) for k in unshared]
            if any(t is None for t in each):
                return None
            self._keep(key, omega, replace(each[0], least=np.max([t.least for t in each], axis=0),
                                           crossing=np.max([t.crossing for t in each], axis=0), runs={}, hints={}))
        return self.kept[key]

    def _capped_one(self, omega: float, k: int | None, w: WidthCase,
                    local: tuple[int, int] | None = None) -> UsageTable | None:
        """The own table of types whose stages sync below ω, the class-k ones across machines
        (None: no class crossing), in [U14]'s case `w` (a stage of t ≥ w.wide_from in every
        pipeline, floors at width w.narrow_to; 0: no condition), with [U15]'s `local` (class, most
        local layers)."""
        key = ("capped", omega, k, w, local)
        if key not in self.kept:
            d = self.types.pipelines
            types = own_capped_types(narrowed_types(self.types, w.narrow_to) if w.narrow_to else self.types, omega)
            types = types if k is None else capped_types(types, k, omega)
            if local is not None:
                fewer = local_capped_types(types, *local, omega)
                if (fewer.caps == types.caps).all():
                    return self._capped_one(omega, k, w)  # no layer count changes: the table without it
                types = fewer
            built = usage_tables({d: types}, self.b, self.deadline, own={d}, wide_from=w.wide_from)
            if built is None:
                return None
            self._keep(key, omega, built[d])
        return self.kept[key]

    def _keep(self, key: tuple, omega: float, table: UsageTable) -> None:
        """Keep a capped table; past CAPPED_BYTES, drop the oldest of other levels than ω, then the
        oldest [U15] tables of ω (every level's tables are reused while a threshold walks the
        intervals, but one level's own cases are kept whatever their size, as the bisection needs
        them; a cell of μ_k is built again where needed). Keys end with [U15]'s `local`."""
        self.kept[key] = table
        others = [other for other in self.kept if other[1] != omega]
        cells_here = [other for other in self.kept if other[1] == omega and other[-1] is not None and other != key]
        for other in others + cells_here:
            if sum(_bytes(t) for t in self.kept.values()) <= CAPPED_BYTES:
                break
            del self.kept[other]


def _bytes(table: UsageTable) -> int:
    return table.least.nbytes + (0 if table.crossing is None else table.crossing.nbytes)


def capped_types(types: ClassTypes, k: int, omega: float) -> ClassTypes:
    """`types` with every class-k type's layers capped where its crossing sync reaches ω:
    n·crossing_layer (+ crossing_head on a last stage) < ω (to 10⁻⁹ relative, lenient)."""
    return _capped(types, np.flatnonzero(types.cls == k), types.crossing_layer, types.crossing_head, omega)


def own_capped_types(types: ClassTypes, omega: float) -> ClassTypes:
    """`types` with every type's layers capped where its own sync floor reaches ω: n·sync_layer
    (+ sync_head on a last stage) < ω. [U4]'s floors hold for any stage of the type, so below ω
    they cap every class, shared or not."""
    return _capped(types, np.arange(types.num_types), types.sync_layer, types.sync_head, omega)


def _capped(types: ClassTypes, rows: np.ndarray, per_layer: np.ndarray, head: np.ndarray, omega: float) -> ClassTypes:
    """`types` with the layers of the types `rows` capped at n·per_layer (+ head if last) < ω."""
    caps = types.caps.copy()
    for i in rows:
        if per_layer[i] <= 0:
            continue  # nothing syncs (D = 1)
        for last in (0, 1):
            room = omega - (head[i] if last else 0.0)
            caps[i, :, last] = np.minimum(caps[i, :, last], max(0, int(np.floor(room / per_layer[i] * (1 + 1e-9)))))
    return replace(types, caps=caps)
