"""[U11] (docs/bounds.md §6): the split on the level of the plan's one T_dp. Above a level ω every
pipeline runs within v − ω with no sync; below it, every stage of a class with no shared machine
crosses and holds fewer layers than its crossing sync allows. Checked against every plan brute
force enumerates on tiny problems, priced by the evaluator: the split never refutes the fastest
plan of a D; it refutes what [U10] does not somewhere; and each of its two cases is needed (the
other alone refutes plans that exist)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from instances.random_small import random_small
from solvers.layered.bound import integer, sync_level
from solvers.layered.bound.classes import class_types
from solvers.layered.bound.pricing import breakpoints
from solvers.layered.bound.sync_level import LEVEL_SHARES, SyncLevelSplit, capped_types, own_capped_types
from solvers.layered.bound.usage import usage_tables
from solvers.layered.tables import Tables
from tests.test_used_classes_bound import SEEDS, _fastest_per_d


def _cases():
    """(the split of D, D, B/b, fastest T of D) over the tiny problems, where D's own table has
    its crossing part."""
    for seed in range(SEEDS):
        problem = random_small(seed, tiny=True)
        tables = Tables(problem)
        by_d = {d: class_types(tables, d) for d in range(1, tables.max_pipelines + 1)}
        b = breakpoints(by_d[1], 3 * tables.trivial_bound)
        own, bare = usage_tables(by_d, b), usage_tables(by_d, b, own=set())
        levels = tuple(share * tables.trivial_bound for share in LEVEL_SHARES)
        for d, t in _fastest_per_d(problem).items():
            if own[d].crossing is not None:
                split = SyncLevelSplit(types=by_d[d], b=b, own=own[d], bare=bare[d], micro=tables.total_micro,
                                       levels=levels, deadline=np.inf)
                yield split, d, tables.total_micro, t


@pytest.fixture(scope="module")
def cases():
    return list(_cases())


def _highest_refuted(refuted, lo: float, hi: float) -> float:
    """The largest threshold `refuted` holds at, bisected in [lo, hi] to 10⁻⁴ relative."""
    while hi - lo > 1e-4 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if refuted(mid) else (lo, mid)
    return lo


def test_the_level_split_never_refutes_the_fastest_plan_of_a_d_and_refutes_more_than_u10(cases) -> None:
    assert len(cases) >= 50, len(cases)
    lifted = 0
    for split, d, micro, t in cases:
        assert not split.refuted(t * (1 + 1e-9)), (d, t)
        u10 = _highest_refuted(lambda v: integer.refuted(split.own, d, micro, v), 0.3 * t, t)
        lifted += split.refuted(u10 * 1.002)
    assert lifted >= 3, lifted


def test_below_the_level_alone_refutes_plans_that_exist(cases, monkeypatch) -> None:
    """Without the case T_dp ≥ ω (as if every plan synced below the least level) the caps refute
    real plans: the first case is needed."""
    monkeypatch.setattr(SyncLevelSplit, "_above", lambda self, omega: replace(self.own, least=np.full_like(
        self.own.least, np.inf), crossing=np.full_like(self.own.least, np.inf), runs={}, hints={}))
    wrong = sum(split.refuted(t * (1 + 1e-9)) for split, d, micro, t in cases)
    assert wrong >= 3, wrong


def test_capping_every_class_whatever_the_case_refutes_plans_that_exist(cases, monkeypatch) -> None:
    """The caps hold only on the classes with no shared machine: capping the shared ones too
    refutes real plans."""
    every = sync_level.SyncLevelSplit._capped_table
    monkeypatch.setattr(SyncLevelSplit, "_capped_table", lambda self, omega, unshared, w, local=None:
                        every(self, omega, list(range(len(self.own.dims))), w, local))
    for split, *_ in cases:
        split.kept.clear()  # tables built by the first test would hide the change (none uses them after)
    wrong = sum(split.refuted(t * (1 + 1e-9)) for split, d, micro, t in cases)
    assert wrong >= 1, wrong


def test_a_class_stage_holds_fewer_layers_than_its_crossing_sync_allows_below_the_level() -> None:
    """Per layer 0.3 s across machines, the head 0.25 s: below ω = 1 s a stage of the capped
    class holds at most 3 layers (0.9 s), a last one 2 (0.85 s); other classes keep their caps."""
    tables = Tables(random_small(3, tiny=True))
    types = class_types(tables, 2)
    types = replace(types, crossing_layer=np.full(types.num_types, 0.3), crossing_head=np.full(types.num_types, 0.25),
                    caps=np.full_like(types.caps, 50))
    capped = capped_types(types, int(types.cls[0]), 1.0)
    of_class = types.cls == types.cls[0]
    assert (capped.caps[of_class, :, 0] == 3).all() and (capped.caps[of_class, :, 1] == 2).all()
    assert (capped.caps[~of_class] == 50).all()


def test_below_the_level_every_stage_holds_fewer_layers_than_its_own_sync_floor_allows() -> None:
    """[U4]'s floors hold for any stage of a type, so below ω they cap every class: per layer
    0.2 s (0.1 s for the second type), the head 0.15 s, ω = 1 s: at most 5 layers, 4 on a last stage
    (0.95 s); 10 and 8 for the second; a type that does not sync (D = 1) keeps its caps."""
    tables = Tables(random_small(0, tiny=True))
    types = class_types(tables, 2)
    per_layer = np.full(types.num_types, 0.2)
    per_layer[1], per_layer[2] = 0.1, 0.0
    types = replace(types, sync_layer=per_layer, sync_head=np.full(types.num_types, 0.15),
                    caps=np.full_like(types.caps, 50))
    capped = own_capped_types(types, 1.0)
    assert (capped.caps[0, :, 0] == 5).all() and (capped.caps[0, :, 1] == 4).all()
    assert (capped.caps[1, :, 0] == 10).all() and (capped.caps[1, :, 1] == 8).all()
    assert (capped.caps[2] == 50).all()
