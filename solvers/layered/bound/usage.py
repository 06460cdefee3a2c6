"""The usage table of the configuration bound (docs/bounds.md §6): for every breakpoint b and
every usage vector u (devices per class), the least bubble of a relaxed pipeline that uses
exactly u and whose every stage time is ≤ b — exact over relaxed pipelines ([U1]).

A dynamic programme over (layers covered, usage): the *prefix* (the first stage and any
middle stages) is built once per problem; the last stage, whose sync floor depends on D, is
added per D. Arrays are [breakpoint, layers, *usage axes] in float32 (the table is deflated
by TABLE_SLACK, so rounding only lowers it). Usage axes count each class's devices 0..N_k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from solvers.layered.bound.classes import ClassTypes, types_where
from solvers.layered.bound.pricing import layer_limits, stage_contribution

TABLE_SLACK = 1e-5  # relative: float32 sums of ≤ 2L terms (each rounding ≤ 6e-8) deflated below the float64 truth
CHUNK = 48  # breakpoints per block (memory: CHUNK·(L+1)·U floats)


@dataclass(frozen=True)
class UsageTable:
    """least[k, u]: least bubble with usage exactly u and every τ ≤ b[k] (inf: none) for one D."""

    b: np.ndarray  # [K] breakpoints
    least: np.ndarray  # [K, U] float32, deflated (U = Π (N_k + 1), C order over classes)
    dims: tuple[int, ...]  # N_k + 1 per class
    crossing: np.ndarray | None = None  # [K, U] the same where the stage that sets b syncs across machines ([U9])
    set_by: np.ndarray | None = None  # [K, classes] least t of a class's stage whose τ can equal b[k] (0: none)
    room: np.ndarray | None = None  # [class, z] ClassTypes.room of the table's D ([U10])
    hints: dict = field(default_factory=dict, compare=False, repr=False)  # [U9]: the set Z that held last
    runs: dict = field(default_factory=dict, compare=False, repr=False)  # threshold → `integer._most_runs`, the last few


def usage_size(types: ClassTypes) -> int:
    return int(np.prod(types.devices + 1))


def _add_stage(types: ClassTypes, prefix: np.ndarray, limit: np.ndarray, role: str, upto: int) -> np.ndarray:
    """min over types i and 1 ≤ n ≤ limit[k, i] of prefix[k, upto − n, u − t_i·e_{class i}] +
    the stage's bubble share: [K, *usage]. The minimum over n is taken in place, one layer count
    at a time, on the usage cells that can take the stage (u_class ≥ t_i) and only on the
    breakpoints whose limit admits n: a [K, n, U] temporary made the DP memory-bound (5× slower
    on hetero-1's 2,025 usage cells); the skipped rows and the reused buffers take 18–33 % off
    a prefix table on the report's rows (benchmarks/report/usage_tables.md)."""
    contrib = stage_contribution(types, role).astype(np.float32)  # [i, n]
    dims, rows_all = prefix.shape[2:], prefix.shape[0]
    best = np.full((rows_all,) + dims, np.inf, dtype=np.float32)
    for i in range(types.num_types):
        top, cls, by = int(min(upto, limit[:, i].max())), int(types.cls[i]), int(types.tp[i])
        if top < 1 or by >= dims[cls]:
            continue
        source, target = _shifted(prefix, best, cls, by)
        cand = np.full(target.shape, np.inf, dtype=np.float32)
        scratch = np.empty_like(cand)
        for n, rows, blocked in _rows_admitting(limit[:, i], top):
            np.add(source[rows, upto - n], contrib[i, n] + blocked, out=scratch[rows])
            np.minimum(cand[rows], scratch[rows], out=cand[rows])
        np.minimum(target, cand, out=target)
    return best


def _shifted(prefix: np.ndarray, best: np.ndarray, cls: int, by: int) -> tuple[np.ndarray, np.ndarray]:
    """(source [K, L+1, ...], target [K, ...]): views in which a cell of the source is usage
    u − by·e_cls and the same cell of the target is u (the class's axis sliced: u_cls ≥ by)."""
    dims, k = prefix.shape[2:], prefix.shape[0]
    outer, inner = int(np.prod(dims[:cls], dtype=np.int64)), int(np.prod(dims[cls + 1:], dtype=np.int64))
    return (prefix.reshape(k, prefix.shape[1], outer, dims[cls], inner)[:, :, :, :dims[cls] - by],
            best.reshape(k, outer, dims[cls], inner)[:, :, by:])


def _rows_admitting(limit: np.ndarray, top: int):
    """(n, rows, blocked) for n = 1 … top: the breakpoints whose layer limit is ≥ n as a slice
    where the limits rise with the breakpoints (sorted b, as every caller passes: a stage's
    limit grows with b), else every row with `blocked` = inf on those whose limit is below n."""
    counts = np.arange(1, top + 1)
    if (np.diff(limit) >= 0).all():
        for n, start in zip(counts.tolist(), np.searchsorted(limit, counts, side="left").tolist()):
            yield n, slice(start, None), np.float32(0.0)
    else:
        for n in counts.tolist():
            yield n, slice(None), np.where(limit >= n, 0.0, np.inf).astype(np.float32)[:, None, None, None]


def _one_stage_more(types: ClassTypes, base: np.ndarray, limit: np.ndarray, role: str) -> np.ndarray:
    """[K, L+1, *usage]: every set of stages of `base` with one stage of `role` added after it."""
    out = np.full_like(base, np.inf)
    for ell in range(1, types.layers + 1):
        out[:, ell] = _add_stage(types, base, limit, role, ell)
    return out


def _lone_stage(types: ClassTypes, limit: np.ndarray, role: str, n: int, dims: tuple[int, ...]) -> np.ndarray:
    """[K, *usage]: one stage of n layers in `role` alone (usage t_i of its class)."""
    contrib = stage_contribution(types, role)[:, n]
    out = np.full((limit.shape[0],) + dims, np.inf, dtype=np.float32)
    for i in range(types.num_types):
        at = [slice(None)] + [0] * len(dims)
        at[1 + int(types.cls[i])] = int(types.tp[i])
        if int(types.tp[i]) < dims[int(types.cls[i])]:
            value = np.where(n <= limit[:, i], contrib[i], np.inf).astype(np.float32)
            out[tuple(at)] = np.minimum(out[tuple(at)], value)
    return out


def prefix_table(types: ClassTypes, b: np.ndarray) -> np.ndarray:
    """[K, L+1, *usage]: least bubble of a first stage plus middle stages covering ℓ layers
    with usage u, every τ ≤ b ([U1]: stages add, the DP runs over ℓ)."""
    big_l, dims = types.layers, tuple(int(d) + 1 for d in types.devices)
    table = np.full((len(b), big_l + 1) + dims, np.inf, dtype=np.float32)
    first, middle = layer_limits(types, b, "first"), layer_limits(types, b, "middle")
    for ell in range(1, big_l + 1):
        start = _lone_stage(types, first, "first", ell, dims)
        table[:, ell] = np.minimum(start, _add_stage(types, table, middle, "middle", ell))
    return table


def wide_prefix_table(types: ClassTypes, b: np.ndarray, prefix: np.ndarray, wide_from: int) -> np.ndarray:
    """`prefix_table` (its table `prefix`) over the prefixes with at least one stage of t ≥
    `wide_from` ([U14]): a wide first stage, a wide stage after any prefix, or any middle stage
    after a prefix that has one."""
    wide, dims = types_where(types, types.tp >= wide_from), prefix.shape[2:]
    middle, wide_first, wide_middle = (layer_limits(types, b, "middle"), layer_limits(wide, b, "first"),
                                       layer_limits(wide, b, "middle"))
    table = np.full_like(prefix, np.inf)
    for ell in range(1, types.layers + 1):
        start = _lone_stage(wide, wide_first, "first", ell, dims)
        np.minimum(start, _add_stage(wide, prefix, wide_middle, "middle", ell), out=start)
        table[:, ell] = np.minimum(start, _add_stage(types, table, middle, "middle", ell))
    return table


def stage_sets(types: ClassTypes, b: np.ndarray) -> dict[str, np.ndarray]:
    """Per role, [K, L+1, *usage] the least bubble share of a set of stages covering ℓ layers with
    usage u, every τ ≤ b — the DP of [U1] without its closing: "middle" middle stages only (the
    empty set at 0 layers and no devices), "first" and "last" with one such stage more, "both"
    with a first and a last stage or one single stage. [U12] runs it on one class at a time."""
    big_l, dims = types.layers, tuple(int(d) + 1 for d in types.devices)
    limits = {role: layer_limits(types, b, role) for role in ("first", "middle", "last", "single")}

    def with_stage(base: np.ndarray, role: str) -> np.ndarray:
        return _one_stage_more(types, base, limits[role], role)

    middle = np.full((len(b), big_l + 1) + dims, np.inf, dtype=np.float32)
    middle[(slice(None), 0) + (0,) * len(dims)] = 0.0
    for ell in range(1, big_l + 1):  # row ℓ from the rows below it
        middle[:, ell] = _add_stage(types, middle, limits["middle"], "middle", ell)
    first, last = with_stage(middle, "first"), with_stage(middle, "last")
    both = with_stage(first, "last")
    for ell in range(1, big_l + 1):
        np.minimum(both[:, ell], _lone_stage(types, limits["single"], "single", ell, dims), out=both[:, ell])
    return {"middle": middle, "first": first, "last": last, "both": both}


Wide = tuple[int, np.ndarray]  # (t, `wide_prefix_table` from t): only pipelines with a stage of t or more ([U14])


def least_bubble(types: ClassTypes, b: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """[K, *usage]: least bubble of a whole relaxed pipeline (prefix + last stage, or one
    single stage) with usage exactly u and every τ ≤ b, with D's last-stage sync floors, or
    without them plus the sync floor of the stage that sets b, whichever is larger [U4]."""
    return own_bubbles(types, b, prefix, crossing=False)[0]


def own_bubbles(types: ClassTypes, b: np.ndarray, prefix: np.ndarray, crossing: bool,
                wide: Wide | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(`least_bubble`, and with `crossing` the same where the stage that sets b syncs across
    machines: the bare bubble plus the least crossing floor of a stage whose τ equals b, [U9]);
    the bare closing is shared. With `wide`: only pipelines with a stage that wide."""
    with_last = _closed(types, b, prefix, wide)
    if types.pipelines < 2:
        return with_last, None  # one pipeline: nothing syncs
    bare, per_b = bare_bubble(types, b, prefix, wide), (-1,) + (1,) * (prefix.ndim - 2)
    least = np.maximum(with_last, bare + widest_stage_sync(types, b).astype(np.float32).reshape(per_b))
    if not crossing:
        return least, None
    across = replace(types, sync_layer=types.crossing_layer, sync_head=types.crossing_head)
    return least, np.maximum(least, bare + widest_stage_sync(across, b).astype(np.float32).reshape(per_b))


def _closed(types: ClassTypes, b: np.ndarray, prefix: np.ndarray, wide: Wide | None = None) -> np.ndarray:
    """[K, *usage]: the prefix closed by a last stage, or one single stage, priced by `types`.
    With `wide` (t, its prefix table): a wide prefix closed by any last stage, or any prefix by
    a wide last stage, or one wide single stage. No single stage where pipelines have two stages
    or more ([U16]: the prefixes are then `_deepened` already)."""
    whole = _add_stage(types, prefix if wide is None else wide[1], layer_limits(types, b, "last"), "last",
                       types.layers)
    last = types if wide is None else types_where(types, types.tp >= wide[0])
    if types.fewest_stages < 2:
        np.minimum(whole, _lone_stage(last, layer_limits(last, b, "single"), "single", types.layers,
                                      prefix.shape[2:]), out=whole)
    if wide is not None:
        np.minimum(whole, _add_stage(last, prefix, layer_limits(last, b, "last"), "last", types.layers), out=whole)
    return whole


def setting_widths(types: ClassTypes, b: np.ndarray) -> np.ndarray:
    """[K, classes] int: per class, the least t of its stages (type i, n layers, last or not) whose
    τ equals b[k] to 10⁻⁶ relative, 0 where it has none — the stage that sets a pipeline's b is
    in a class with a positive entry ([U9]), on at least that many devices ([U10])."""
    _, of_type = _stage_times(types)
    out = np.zeros((len(b), len(types.devices)), dtype=int)
    width = types.tp[of_type]
    for lo, match in _matching_stages(types, b):
        for k in range(len(types.devices)):
            least = np.where(match & (types.cls[of_type] == k)[None, :], width[None, :], np.iinfo(int).max).min(axis=1)
            out[lo:lo + CHUNK, k] = np.where(least < np.iinfo(int).max, least, 0)
    return out


def widest_stage_sync(types: ClassTypes, b: np.ndarray) -> np.ndarray:
    """[K]: the least sync floor of a stage whose τ equals b: a type i with n layers (n·τ_layer,
    sync ≥ n·sync_layer) or a last stage (n·τ_layer + τ_head, sync ≥ n·sync_layer + sync_head);
    the least over every (i, n, role) whose τ matches b to 10⁻⁶ relative (more matches only
    lower it). T_dp ≥ that stage's sync [U4]."""
    n = np.arange(1, types.layers + 1)[None, :]
    syncs = np.concatenate([(n * types.sync_layer[:, None]).ravel(),
                            (n * types.sync_layer[:, None] + types.sync_head[:, None]).ravel()])
    out = np.zeros(len(b))
    for lo, match in _matching_stages(types, b):
        least = np.where(match, syncs[None, :], np.inf).min(axis=1)
        out[lo:lo + CHUNK] = np.where(np.isfinite(least), least, 0.0)
    return out


def _stage_times(types: ClassTypes) -> tuple[np.ndarray, np.ndarray]:
    """(τ, type index) of every stage (i, n, headed or not), in the order (headed, i, n)."""
    n = np.arange(1, types.layers + 1)[None, :]
    plain = (n * types.per_layer[:, None]).ravel()
    headed = (n * types.per_layer[:, None] + types.head[:, None]).ravel()
    of_type = np.repeat(np.arange(types.num_types), types.layers)
    return np.concatenate([plain, headed]), np.concatenate([of_type, of_type])


def _matching_stages(types: ClassTypes, b: np.ndarray):
    """(first breakpoint index, [CHUNK, stages] bool) per block of breakpoints: the stages of
    `_stage_times` whose τ equals the breakpoint to 10⁻⁶ relative."""
    taus, _ = _stage_times(types)
    for lo in range(0, len(b), CHUNK):
        block = b[lo:lo + CHUNK, None]
        yield lo, np.abs(taus[None, :] - block) <= 1e-6 * block


def hop_floor(types: ClassTypes) -> np.ndarray:
    """[*usage]: (machines spanned − 1)·hop [U3]."""
    return np.maximum(machines_spanned(types) - 1, 0) * types.hop


def machines_spanned(types: ClassTypes) -> np.ndarray:
    """[*usage] the fewest machines a pipeline of usage u spans: Σ_k ⌈u_k / machine size_k⌉."""
    grids = np.meshgrid(*[np.arange(int(d) + 1) for d in types.devices], indexing="ij")
    return sum(np.ceil(g / int(s)) for g, s in zip(grids, types.machine_size)).astype(int)


def usage_tables(by_d: dict[int, ClassTypes], b: np.ndarray, deadline: float = float("inf"),
                 own: set[int] | None = None, crossing: bool = True, wide_from: int = 0) -> dict[int, UsageTable] | None:
    """A table for every D in `by_d` (same classes): D's own (`least_bubble`) for the D in
    `own` (None: all), the *bare* table (`bare_bubble`, no sync floor) for the others — one
    per group of D with the same memory caps (all of them without ZeRO-1), below each one's
    own, so it refutes for all of them at the cost of one table. The prefix is built once per
    block of breakpoints and shared by the D whose caps agree. With `crossing`, an own table of
    D ≥ 2 also carries its crossing part and its breakpoints' setting classes ([U9]). None when `deadline`
    (perf_counter) passes before every block is built: a partial table would not be a bound.
    `wide_from`: only pipelines with a stage of at least that many devices ([U14]; 0: any)."""
    own = set(by_d) if own is None else own
    key_of = {d: _key(by_d[d], d if d in own else None) for d in by_d}
    built = _tables(by_d, b, set(key_of.values()), deadline, crossing, wide_from)
    return None if built is None else {d: built[key_of[d]] for d in by_d}


def route_tables(by_d: dict[int, ClassTypes], b: np.ndarray, deadline: float, own: set[int],
                 crossing: bool) -> tuple[dict[int, UsageTable], dict[int, UsageTable]] | None:
    """(bare, own): the bare table of every D in `by_d` (one per group of D with the same caps,
    also where every D of the group has its own: [U11]'s split lifts the bare one) and the own
    tables of the D in `own`, in one pass; None when `deadline` passes first."""
    bare_key, own_key = {d: _key(by_d[d], None) for d in by_d}, {d: _key(by_d[d], d) for d in own}
    built = _tables(by_d, b, set(bare_key.values()) | set(own_key.values()), deadline, crossing, 0)
    if built is None:
        return None
    return {d: built[key] for d, key in bare_key.items()}, {d: built[key] for d, key in own_key.items()}


def _key(types: ClassTypes, d: int | None) -> tuple[bytes, int | None]:
    """A table's key: its memory caps and its D (None: the bare table those caps share)."""
    return types.caps.tobytes(), d


def _tables(by_d: dict[int, ClassTypes], b: np.ndarray, keys: set[tuple], deadline: float, crossing: bool,
            wide_from: int) -> dict[tuple, UsageTable] | None:
    """The tables of `keys` (`_key`), block by block of breakpoints, one prefix per caps group."""
    of_caps = {}
    for d in sorted(by_d):
        of_caps.setdefault(by_d[d].caps.tobytes(), d)  # the types a bare table is built from
    any_types = by_d[min(by_d)]
    dims = tuple(int(n) + 1 for n in any_types.devices)
    hops = hop_floor(any_types).astype(np.float32)
    parts: dict[tuple, list[np.ndarray]] = {key: [] for key in keys}
    crossing_parts = {key: [] for key in keys if crossing and key[1] is not None and by_d[key[1]].pipelines >= 2}
    for lo in range(0, len(b), CHUNK):
        if time.perf_counter() > deadline:
            return None
        block, prefixes = b[lo:lo + CHUNK], {}
        for caps, d in sorted(keys, key=lambda key: (key[0], key[1] or 0)):
            types = by_d[of_caps[caps] if d is None else d]
            if caps not in prefixes:
                prefixes[caps] = _prefixes(types, block, wide_from)
            prefix, wide = prefixes[caps]
            if d is None:
                parts[caps, d].append(bare_bubble(types, block, prefix, wide) + hops)
                continue
            least, across = own_bubbles(types, block, prefix, crossing=(caps, d) in crossing_parts, wide=wide)
            parts[caps, d].append(least + hops)
            if across is not None:
                crossing_parts[caps, d].append(across + hops)
    return {key: UsageTable(b=b, least=_deflated(part), dims=dims,
                            crossing=_deflated(crossing_parts[key]) if key in crossing_parts else None,
                            set_by=setting_widths(any_types, b) if key in crossing_parts else None,
                            room=by_d[key[1]].room if key in crossing_parts else None)
            for key, part in parts.items()}


def _prefixes(types: ClassTypes, b: np.ndarray, wide_from: int) -> tuple[np.ndarray, Wide | None]:
    """The prefix table and, where some type is narrower than `wide_from`, the wide one; both of
    at least fewest_stages − 1 stages ([U16])."""
    prefix = prefix_table(types, b)
    wide = None if not (types.tp < wide_from).any() else (wide_from, wide_prefix_table(types, b, prefix, wide_from))
    for _ in range(types.fewest_stages - 2):
        prefix, wide = _deepened(types, b, prefix, wide)
    return prefix, wide


def _deepened(types: ClassTypes, b: np.ndarray, prefix: np.ndarray, wide: Wide | None) -> tuple[np.ndarray, Wide | None]:
    """Prefixes of one stage more than `prefix` (of k stages at least): a middle stage added to
    each; the wide ones: a wide middle stage after any, or any middle stage after a wide one."""
    middle = layer_limits(types, b, "middle")
    deeper = _one_stage_more(types, prefix, middle, "middle")
    if wide is None:
        return deeper, None
    narrow = types_where(types, types.tp >= wide[0])
    wide_middle, wider = layer_limits(narrow, b, "middle"), np.full_like(prefix, np.inf)
    for ell in range(1, types.layers + 1):
        wider[:, ell] = np.minimum(_add_stage(narrow, prefix, wide_middle, "middle", ell),
                                   _add_stage(types, wide[1], middle, "middle", ell))
    return deeper, (wide[0], wider)


def _deflated(blocks: list[np.ndarray]) -> np.ndarray:
    """[K, U] a table's blocks, deflated by TABLE_SLACK below the float64 truth (float32)."""
    return (np.concatenate(blocks).reshape(sum(len(x) for x in blocks), -1).astype(np.float64)
            * (1 - TABLE_SLACK)).astype(np.float32)


def bare_bubble(types: ClassTypes, b: np.ndarray, prefix: np.ndarray, wide: Wide | None = None) -> np.ndarray:
    """[K, *usage]: least bubble of a whole relaxed pipeline without any sync floor (T_dp ≥ 0):
    below `least_bubble` of every D with these caps, since every floor it adds is ≥ 0. `prefix`
    (and `wide`) are `types`' own; where every stage carries a share of its sync ([U16]) they hold
    it, so the bare prefixes are built again (the bare table plus a stage's floor would count that
    stage's sync twice: a tiny problem's bound rose above brute force's optimum so)."""
    bare = replace(types, sync_layer=np.zeros_like(types.sync_layer), sync_head=np.zeros_like(types.sync_head))
    if types.stage_sync_share > 0:
        prefix, wide = _prefixes(bare, b, 0 if wide is None else wide[0])
    return _closed(bare, b, prefix, wide)
