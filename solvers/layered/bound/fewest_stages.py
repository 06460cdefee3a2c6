"""[U16] The fewest stages of any pipeline (docs/bounds.md §6).

T_dp is the largest sync of any stage, and every holder of a layer pays its ring (docs/cost-model.md
§3.4): τ_dp(ℓ) is at least the floor of any holder's type ([U4]'s sync_layer, valid for any stage
of it). Let s be the fewest stages of any pipeline, and q such a pipeline: its s stages hold every
layer once, so one of them syncs at least (1/s)·Σ_ℓ τ_dp(ℓ) ≥ G_p/s for *every* pipeline p, with
G_p = Σ over p's stages of n·sync_layer (+ sync_head on its last). So T ≥ T_pipe(p) + G_p/s: each
stage's floor, times 1/s, *adds* to its pipeline's bubble, where [U4] counts one stage's. Every plan
with D pipelines is in one of the cases s = 1 … FEWEST_SPLIT, or has more stages in every pipeline:

- case s: tables of pipelines of ≥ s stages, every stage's floor times 1/s in the bubble
  (`ClassTypes.stage_sync_share`, `fewest_stages`); for s ≥ 2 at least their table with the last
  stage's floor alone;
- the rest: tables of pipelines of FEWEST_SPLIT + 1 stages or more, as the route's otherwise.

A threshold is refuted for D when the route's test refutes it, or every case does. On gen-24
seed 2, D = 3 (integer test alone): 5.8325 s unsplit; case 1 5.904 s, case 2 5.893 s, the rest
6.062 s. The relaxed plans that held it had pipelines of one stage (four A100s, all 40 layers)
beside pipelines of many, each of whose stages the unsplit tables priced with its own sync alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from solvers.layered.bound.classes import ClassTypes, range_types
from solvers.layered.bound.usage import UsageTable, usage_tables
from solvers.layered.tables import Tables

FEWEST_SPLIT = 2  # cases s = 1, 2 of their own; the route's tables hold pipelines of 3 stages or more
# prefixes the cases' first tables take (cases 1 and 2 shared, each with its bare prefix; the last
# stage's floor of case 2; the rest; three bare tables), and the share of the time left they may
# take: on gen-40 seed 0 (four classes, about 70 s a prefix) they would have taken the whole 600 s
CASE_PREFIXES = 9
CASE_TIME_SHARE = 0.5


def with_fewest_stages(types: ClassTypes, fewest: int, share: float = 0.0) -> ClassTypes:
    """`types` whose pipelines have `fewest` stages or more, every stage's sync floor times `share`
    in the bubble (0: the last stage's alone)."""
    return replace(types, fewest_stages=fewest, stage_sync_share=share)


def case_types(types: ClassTypes, s: int) -> ClassTypes:
    """Case s's types (1 ≤ s ≤ FEWEST_SPLIT): pipelines of s stages or more, every floor times 1/s."""
    return with_fewest_stages(types, s, 1.0 / s)


def single_stage_floors(types: ClassTypes) -> np.ndarray:
    """[U17] [i]: a floor of T_dp in a plan of D ≥ 2 pipelines one of which is a single stage of
    type i (class k, width t; inf where such a stage cannot hold all L layers). The stage holds
    every layer and the head, so T_dp ≥ its summed syncs. A layer syncs within its machine only if
    all D − 1 other pipelines hold it there, on the N_k − t devices left (N_k: the class's largest
    machine): one of them has at most ⌊(N_k − t)/(D − 1)⌋ of those devices, holding at most ρ_k
    layers each (ρ_k: the most layers per device any class-k stage holds within memory). So at most
    λ = min(L, ⌊(N_k − t)/(D − 1)⌋·ρ_k) layers are local and the rest cross machines:
    T_dp ≥ λ·sync_layer + (L − λ)·crossing_layer + sync_head."""
    big_l, d = types.layers, types.pipelines
    if d < 2:
        return np.where(types.caps[:, 1, 1] >= big_l, 0.0, np.inf)
    per_device = types.caps.max(axis=(1, 2)) / types.tp
    rho = np.array([per_device[types.cls == k].max(initial=0.0) for k in range(len(types.devices))])
    beside = (types.machine_size[types.cls] - types.tp) // (d - 1)
    local = np.minimum(big_l, np.floor(beside * rho[types.cls] + 1e-9))
    floor = local * types.sync_layer + (big_l - local) * types.crossing_layer + types.sync_head
    return np.where(types.caps[:, 1, 1] >= big_l, floor, np.inf)


def single_stage_floor(types: ClassTypes, threshold: float) -> float:
    """[U17]: the least floor of T_dp over the types whose single stage of all L layers fits
    τ ≤ `threshold` (inf: none does, so no plan of T ≤ threshold has a one-stage pipeline)."""
    fits = types.layers * types.per_layer + types.head <= threshold * (1 + 1e-9)
    return float(single_stage_floors(types)[fits].min(initial=np.inf))


def _span(d: int, most: int) -> tuple[int, int]:
    """The range [2^j, 2^(j+1)) ∩ [.., most] that holds D (D = 1 alone)."""
    low = 1 << (d.bit_length() - 1)
    return low, min(2 * low - 1, most)


@dataclass
class FewestStagesCases:
    """The tables of [U16]'s cases on the usage route: s = 1 … FEWEST_SPLIT and the rest (s =
    FEWEST_SPLIT + 1: pipelines of that many stages or more, no shares). Case s ≤ FEWEST_SPLIT of
    D: D's own table where built (when a refinement asks: the shares depend on D in every stage,
    so it costs a prefix of its own), else one shared by the D of D's range [2^j, 2^(j+1))
    (`range_types`: the least floors and largest caps of the range, valid for each of its D). The
    rest: as the route's tables (own for the route's `own` D, else bare), built for every D at once
    on one prefix when first asked."""

    tables: Tables
    by_gpu: bool
    b: np.ndarray
    by_d: dict[int, ClassTypes]  # the route's class-level types of every D (no split)
    own_ds: set[int]
    crossing: bool
    deadline: float = float("inf")  # perf_counter: tables not built by then are not built
    prefix_s: float = 0.0  # the estimated time of one prefix table
    own: dict[tuple[int, int], UsageTable] = field(default_factory=dict)
    shared: dict[tuple[int, tuple[int, int]], UsageTable] = field(default_factory=dict)
    rest: dict[int, UsageTable] = field(default_factory=dict)
    last_floor: dict[int, dict[int, UsageTable]] = field(default_factory=dict)
    bares: dict[tuple[int, bytes], UsageTable] = field(default_factory=dict)
    helped: set[int] = field(default_factory=set)  # the D where the cases refuted what the route's test did not

    @staticmethod
    def cases() -> range:
        return range(1, FEWEST_SPLIT + 2)

    def affordable(self) -> bool:
        """Whether the cases' first tables are built, or fit CASE_TIME_SHARE of the time left (estimated)."""
        if self.shared or self.rest:
            return True
        return CASE_PREFIXES * self.prefix_s <= CASE_TIME_SHARE * (self.deadline - time.perf_counter())

    def types(self, d: int, s: int) -> ClassTypes:
        plain = self.by_d[d]
        return case_types(plain, s) if s <= FEWEST_SPLIT else with_fewest_stages(plain, s)

    def has_own(self, d: int, s: int) -> bool:
        """Whether case s's table of D is D's own (with its sync floors), not a bare one."""
        return s <= FEWEST_SPLIT or d in self.own_ds

    def table(self, d: int, s: int, deadline: float | None) -> UsageTable | None:
        """Case s's table of D: its own where built (built now with a `deadline`), else the shared
        one; None where the time ran out first."""
        if s > FEWEST_SPLIT:
            if not self.rest:
                by_d = {e: self.types(e, s) for e in self.by_d}
                self.rest.update(usage_tables(by_d, self.b, self.deadline, own=self.own_ds, crossing=self.crossing)
                                 or {})
            return self.rest.get(d)
        if (d, s) not in self.own and deadline is not None:
            built = usage_tables({d: self.types(d, s)}, self.b, deadline, own={d})
            table = None if built is None else self._with_last_floor(d, s, built[d])
            if table is not None:
                self.own[d, s] = table
        if (d, s) in self.own:
            return self.own[d, s]
        span = _span(d, max(self.by_d))
        if (s, span) not in self.shared:
            types = case_types(range_types(self.tables, *span, self.by_gpu), s)
            built = usage_tables({span[1]: types}, self.b, self.deadline, own={span[1]})
            if built is None:
                return None
            self.shared[s, span] = built[span[1]]
        table = replace(self.shared[s, span], room=self.by_d[d].room, runs={}, hints={})
        return self._with_last_floor(d, s, table)

    def _with_last_floor(self, d: int, s: int, table: UsageTable) -> UsageTable | None:
        """For s ≥ 2, the larger of `table` and D's table of the same pipelines with the last
        stage's floor alone, not the shares (T_dp is at least both, and neither table is below the
        other everywhere: on gen-24 seed 2, D = 3, case 2 refuted up to 5.818 s with the shares
        alone, the unsplit table 5.8325 s); those are built for every D at once, on one prefix,
        without their crossing parts (memory: the route holds as many)."""
        if s == 1:
            return table  # every stage's whole floor: above the last stage's alone
        if s not in self.last_floor:
            by_d = {e: with_fewest_stages(types, s) for e, types in self.by_d.items()}
            built = usage_tables(by_d, self.b, self.deadline, crossing=False)
            if built is None:
                return None
            self.last_floor[s] = built
        last = self.last_floor[s][d]
        crossing = None if table.crossing is None else np.maximum(table.crossing, last.least)
        return replace(table, least=np.maximum(table.least, last.least), crossing=crossing, runs={}, hints={})

    def bare(self, d: int, s: int) -> UsageTable | None:
        """A bare table (no sync floor) of pipelines of s stages or more, for D's memory caps
        (None where the time ran out first)."""
        types = with_fewest_stages(self.by_d[d], s)
        key = (s, types.caps.tobytes())
        if key not in self.bares:
            built = usage_tables({d: types}, self.b, self.deadline, own=set())
            if built is None:
                return None
            self.bares[key] = built[d]
        return self.bares[key]

    def built(self, d: int) -> list[tuple[ClassTypes, UsageTable]]:
        """(types, table) of every case of D whose table is built (none is built here): plans are
        read back from them too (docs/bounds.md §8)."""
        return [(self.types(d, s), self.table(d, s, None)) for s in self.cases() if self._ready(d, s)]

    def _ready(self, d: int, s: int) -> bool:
        if s > FEWEST_SPLIT:
            return d in self.rest
        shared = (s, _span(d, max(self.by_d))) in self.shared
        return ((d, s) in self.own or shared) and (s == 1 or s in self.last_floor)
