"""[U14] the narrowest holder and [U15] local layers of a shared class (docs/bounds.md §6): the
tables of pipelines with a wide stage, the floors raised to a narrower width, the caps of a class
whose local layers are few, and the usage mask. The brute-force checks of both (no interval
refutes the fastest plan in it) are in test_aligned_bound.py, whose splits run them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from instances.random_small import random_small
from planner.layered.pricing import breakdown
from solvers.layered.bound import integer
from solvers.layered.bound.classes import class_types, types_where
from solvers.layered.bound.local_layers import cells, layers_per_device, local_capped_types, with_layers_on
from solvers.layered.bound.narrowest import SYNC_FLOORS, case_widths, narrowed_types, width_case
from solvers.layered.bound.plans import trace
from solvers.layered.bound.pricing import breakpoints
from solvers.layered.bound.sync_level import SyncLevelSplit
from solvers.layered.bound.usage import usage_tables
from solvers.layered.exact import brute
from solvers.layered.tables import Tables


def _types(seed: int, d: int = 2):
    """Class types of D on a small random problem with types of several widths, and breakpoints."""
    tables = Tables(random_small(seed))
    types = class_types(tables, min(d, tables.max_pipelines))
    return types, breakpoints(types, 3 * tables.trivial_bound)


def _several_widths() -> list:
    found = [(seed, *_types(seed)) for seed in range(40)]
    return [(seed, types, b) for seed, types, b in found if len(case_widths(types)) > 1 and types.pipelines > 1][:8]


@pytest.fixture(scope="module")
def several_widths():
    cases = _several_widths()
    assert len(cases) >= 5, len(cases)
    return cases


def test_pipelines_with_a_wide_stage_and_the_rest_make_the_whole_bare_table(several_widths) -> None:
    """Every pipeline has a stage of t ≥ w or only narrower ones: the least bubble over both kinds
    is the table's (exactly: the bare tables are minima over paths of the same sums). The own
    tables of the wide ones are above the whole's (fewer pipelines, the same floors)."""
    differ = 0
    for seed, types, b in several_widths:
        d = types.pipelines
        whole, whole_own = usage_tables({d: types}, b, own=set())[d], usage_tables({d: types}, b)[d]
        for w in case_widths(types)[1:]:
            wide = usage_tables({d: types}, b, own=set(), wide_from=w)[d]
            narrow = usage_tables({d: types_where(types, types.tp < w)}, b, own=set())[d]
            np.testing.assert_array_equal(np.minimum(wide.least, narrow.least), whole.least, err_msg=f"seed {seed} w {w}")
            differ += bool(np.isfinite(wide.least).any() and (wide.least > whole.least).any())
            wide_own = usage_tables({d: types}, b, wide_from=w)[d]
            assert (wide_own.least >= whole_own.least).all() and (wide_own.crossing >= whole_own.crossing).all()
    assert differ >= 3, differ  # the flag restricts something


def test_a_width_every_type_reaches_changes_nothing(several_widths) -> None:
    seed, types, b = several_widths[0]
    d, least = types.pipelines, int(types.tp.min())
    np.testing.assert_array_equal(usage_tables({d: types}, b, wide_from=least)[d].least, usage_tables({d: types}, b)[d].least)


def test_narrowed_floors_are_the_width_w_types_of_the_class(several_widths) -> None:
    for _, types, _ in several_widths:
        for w in case_widths(types):
            narrow = narrowed_types(types, w)
            for i in range(types.num_types):
                same = np.flatnonzero((types.cls == types.cls[i]) & (types.tp == w))
                for name in SYNC_FLOORS:
                    own, got = getattr(types, name)[i], getattr(narrow, name)[i]
                    want = max(own, getattr(types, name)[same[0]]) if types.tp[i] > w and len(same) else own
                    assert got == want, (name, i, w)


def test_local_caps_golden(several_widths) -> None:
    """A class-k type with own floor s and crossing floor c holds n layers, at most m of them local:
    it syncs n·s + max(0, n − m)·(c − s). Below ω it holds the largest such n."""
    _, types, _ = several_widths[0]
    k = int(types.cls[np.argmax(types.crossing_layer)])
    i = int(np.flatnonzero(types.cls == k)[0])
    s, c = types.sync_layer[i], max(types.crossing_layer[i], types.sync_layer[i])
    omega = 2 * s + 1.5 * c  # with 2 local: 3 layers sync 2s + c (fit), 4 layers 2s + 2c (do not)
    capped = local_capped_types(types, k, 2, omega)
    want = max(n for n in range(types.layers + 1) if n * s + max(0, n - 2) * (c - s) < omega)
    assert capped.caps[i, 0, 0] == min(types.caps[i, 0, 0], want)
    assert (capped.caps[types.cls != k] == types.caps[types.cls != k]).all()
    assert (local_capped_types(types, k, types.layers, omega).caps[i, 0, 0]
            == min(types.caps[i, 0, 0], max(n for n in range(types.layers + 1) if n * s < omega)))


def test_cells_cover_every_count_once() -> None:
    for layers in (1, 2, 5, 40, 80):
        got = [m for lo, hi in cells(layers) for m in range(lo, hi + 1)]
        assert got == list(range(layers + 1)), layers


def test_usages_with_too_few_devices_of_the_class_are_dropped(several_widths) -> None:
    _, types, b = several_widths[0]
    d = types.pipelines
    table = usage_tables({d: types}, b)[d]
    rho = layers_per_device(types, 0, b)
    masked = with_layers_on(table, 0, 2, rho)
    on_class = np.unravel_index(np.arange(int(np.prod(table.dims))), table.dims)[0]
    short = on_class[None, :] * rho[:, None] < 2
    assert short.any() and (~short).any()
    assert np.isinf(masked.least[short]).all()
    np.testing.assert_array_equal(masked.least[~short], table.least[~short])
    assert with_layers_on(table, 0, 0, rho) is table


def test_devices_per_layer_bound_every_traced_pipeline(several_widths) -> None:
    """ρ_k(b) is the most layers a class-k device holds at τ ≤ b: no relaxed pipeline the DP
    traces at b holds more than u_k·ρ_k(b) layers on class k, and small b lowers ρ."""
    checked = 0
    for _, types, b in several_widths:
        d = types.pipelines
        table = usage_tables({d: types}, b)[d]
        least = table.least.reshape((len(b),) + table.dims)
        for k in range(len(table.dims)):
            rho = layers_per_device(types, k, b)
            assert (np.diff(rho) >= 0).all()  # more room per stage, more layers per device
            for j in range(0, len(b), max(1, len(b) // 6)):
                for u in zip(*np.nonzero(np.isfinite(least[j]))):
                    stages = trace(types, float(b[j]), tuple(int(x) for x in u))
                    held = sum(n for i, n, _ in stages if types.cls[i] == k)
                    assert held <= u[k] * rho[j] + 1e-9, (j, u, stages)
                    checked += 1
    assert checked > 100, checked


def test_a_run_of_widths_refuted_by_its_halves_is_not_taken_as_left_open(several_widths, monkeypatch) -> None:
    """Where the whole run of widths stands but its halves are refuted, the interval is refuted,
    and asked again it is refuted again: the run "left open" that the next threshold tries first
    is one the halving could not split. (Taking the whole run as the one left open made every
    later threshold stop at its first test: h800-h20-16-24's D = 2 stopped at 67.8166 s where
    the split, asked afresh, refutes 67.9523 s.) The tables' answers are faked per case of W:
    refuted exactly for single widths."""
    _, types, b = several_widths[0]
    d = types.pipelines
    table = usage_tables({d: types}, b)[d]
    split = SyncLevelSplit(types=types, b=b, own=table, bare=table, micro=8, levels=(1.0,), deadline=np.inf,
                           extended=True)
    singles = {width_case(types, (w,)) for w in case_widths(types)}
    monkeypatch.setattr(SyncLevelSplit, "_case_table", lambda self, lo, hi, unshared, w, local=None: w)
    monkeypatch.setattr(integer, "refuted_in_case", lambda w, *args, **kwargs: w in singles)
    monkeypatch.setattr(SyncLevelSplit, "_local_refuted", lambda self, *args: False)
    asked = []
    width_refuted = SyncLevelSplit._width_refuted
    monkeypatch.setattr(SyncLevelSplit, "_width_refuted",
                        lambda self, v, lo, hi, widths: asked.append(widths) or width_refuted(self, v, lo, hi, widths))
    assert split._cases_refuted(1.0, 0.0, 1.0)
    assert asked[0] == case_widths(types) and len(asked) > 1  # the whole run stood, its halves were tried
    assert split._cases_refuted(1.0, 0.0, 1.0)
    assert split._cases_refuted(0.9, 0.0, 1.0)


def brute_plans_by_d(problems, plans: int):
    """(problem, plan, class-level types at its D, `_priced_stages`) for the first `plans` plans brute
    force lists of each problem that have D ≥ 2 pipelines; the types built once per D."""
    for problem in problems:
        tables, by_d = Tables(problem), {}
        for pipes in itertools.islice(brute.enumerate_plans(problem), plans):
            if len(pipes) < 2:
                continue
            if len(pipes) not in by_d:  # (not setdefault: it would build the types for every plan)
                by_d[len(pipes)] = class_types(tables, len(pipes))
            yield problem, pipes, by_d[len(pipes)], _priced_stages(problem, pipes)


def type_index(types, machine: int, t: int) -> int:
    """The class-level type of a stage of width t on `machine`."""
    return int(np.flatnonzero((types.cls == types.class_of_machine[machine]) & (types.tp == t))[0])


def _priced_stages(problem, pipes) -> list[list[tuple[int, int, int, float, bool]]]:
    """Per pipeline of the plan, per stage: (machine, t, layers, its sync τ_dp, last), τ_dp as the
    evaluator prices it (its breakdown, without the simulated schedule: a third of its time)."""
    table = brute.plan_table(problem, pipes)
    stages = zip(table.machine.tolist(), table.tp.tolist(), table.layers.tolist(),
                 breakdown(problem, table).dp.tolist(), table.last.astype(bool).tolist())
    rows = list(stages)
    return [rows[lo:hi] for lo, hi in zip(table.pipe_start[:-1].tolist(), table.pipe_start[1:].tolist())]


def _fewest_layers_per_class(pipelines, of_machine: np.ndarray) -> dict[int, int]:
    """μ_k: the fewest layers any pipeline holds on class k (0 where some pipeline holds none)."""
    held = [{} for _ in pipelines]
    for mine, stages in zip(held, pipelines):
        for machine, _, layers, _, _ in stages:
            k = int(of_machine[machine])
            mine[k] = mine.get(k, 0) + layers
    return {k: min(h.get(k, 0) for h in held) for k in set().union(*held)}


def test_every_real_stage_syncs_at_least_the_floors_of_the_narrowest_holder_and_of_few_local_layers() -> None:
    """The premises of [U14] and [U15], against the evaluator on every plan brute force lists (the
    first 2,000 per problem) on 40 tiny and 20 small problems: with W the least over pipelines of
    their widest stage, every stage syncs at least n·s_W (+ the head's floor on a last stage), s_W
    its class's width-W floor; and at least n·s + max(0, n − μ_k)·(c − s) on class k."""
    raised = local = 0
    problems = [random_small(seed, tiny=True) for seed in range(40)] + [random_small(seed) for seed in range(20)]
    for problem, pipes, types, pipelines in brute_plans_by_d(problems, 2000):
        narrow = narrowed_types(types, min(max(t for _, t, _, _, _ in stages) for stages in pipelines))
        fewest = _fewest_layers_per_class(pipelines, types.class_of_machine)
        for machine, t, n, synced, last in (stage for stages in pipelines for stage in stages):
            k, i = int(types.class_of_machine[machine]), type_index(types, machine, t)
            head = narrow.sync_head[i] if last else 0.0
            at_w = n * narrow.sync_layer[i] + head
            s, c = narrow.sync_layer[i], max(narrow.crossing_layer[i], narrow.sync_layer[i])
            with_local = n * s + max(0, n - fewest[k]) * (c - s) + head
            assert synced >= at_w * (1 - 1e-9) and synced >= with_local * (1 - 1e-9), (problem.name, pipes, i)
            raised += at_w > (n * types.sync_layer[i] + (types.sync_head[i] if last else 0.0)) * (1 + 1e-6)
            local += with_local > at_w * (1 + 1e-6)
    assert raised >= 50 and local >= 50, (raised, local)


def test_a_run_of_widths_is_its_least_as_a_condition_and_its_largest_as_floors(several_widths) -> None:
    _, types, _ = several_widths[0]
    widths = case_widths(types)
    assert width_case(types, (0,)) == width_case(types, widths) == (0, 0)  # the test without the split
    assert width_case(types, widths[:1]) == (0, widths[0])
    assert width_case(types, widths[-1:]) == (widths[-1], 0)
    assert width_case(types, widths[1:]) == (widths[1], 0)
