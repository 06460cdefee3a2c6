"""The integer configuration test of one D at one threshold v (docs/bounds.md §6, [U2]).

From the usage table of D (least bubble per breakpoint and usage vector), every usage u gets
its most micro-batches within v: F(u) = max over breakpoints b of ⌊(v − least[b, u])/b⌋ + 1,
capped at B/b − D + 1. A plan with D pipelines and T ≤ v has D pipelines whose usages fit
the classes and whose F sum to at least B/b, so the integer programme

    max Σ_u F(u)·x_u   s.t.  Σ_u u·x_u ≤ N,  Σ_u x_u = D,  x_u ∈ ℕ, only u with F(u) ≥ 1

reaches B/b. When its optimum (or HiGHS's proven upper bound on it) is below B/b, no plan
with D pipelines has T ≤ v. Devices may stay idle, so F is first made non-decreasing in u,
and only the usages where it steps up (the least devices for each capacity) are columns.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import highspy
import numpy as np

from planner.prices import spendable
from solvers.layered.bound.classes import ClassTypes
from solvers.layered.bound.pricing import SLACK
from solvers.layered.bound.usage import UsageTable, machines_spanned
from solvers.milp_backend import quiet_highs

PRESOLVE_OFF_COLUMNS = 100  # HiGHS's presolve off from this many columns (`_most_micro`; docs/bounds.md [U2′])
MILP_SECONDS = 20.0  # per test; past it HiGHS's dual bound decides (still a valid certificate)


class Rows(NamedTuple):
    """More rows of the integer programme over its columns: lower ≤ matrix·x ≤ upper."""

    matrix: np.ndarray  # [rows, columns]
    lower: np.ndarray  # [rows] (−inf: none)
    upper: np.ndarray  # [rows] (inf: none)


@dataclass(frozen=True)
class Rent:
    """A budget in the integer test ([U6]): a plan that uses u_k devices of class k rents at
    least ⌈u_k / size_k⌉ of its machines (size_k: its largest), each at least the class's least
    rent, so y_k machines per class with Σ_p u_p,k ≤ size_k·y_k and Σ_k rent_k·y_k ≤ budget."""

    size: np.ndarray  # [class] devices of its largest machine
    machines: np.ndarray  # [class] machines in the class (y_k's upper bound)
    least_rent: np.ndarray  # [class] least rent per hour of one machine
    budget: float  # per hour, with the planner's slack (planner.prices.fits_budget)

    @classmethod
    def of(cls, types: ClassTypes, budget: float | None) -> Rent | None:
        """The budget of a problem over these classes (None without one)."""
        if budget is None:
            return None
        return cls(size=types.machine_size, machines=types.machines, least_rent=types.least_rent,
                   budget=spendable(budget))


def capacities(table: UsageTable, threshold: float, most: int) -> np.ndarray:
    """[*usage] F(u): the most micro-batches a pipeline of usage ≤ u runs within `threshold`."""
    return _closed(np.minimum(_most_runs(table, threshold), most).reshape(table.dims))


def _closed(best: np.ndarray) -> np.ndarray:
    """The least array above `best` that does not fall along any axis: devices may stay idle."""
    for axis in range(best.ndim):
        best = np.maximum.accumulate(best, axis=axis)
    return best


def spanning_capacities(table: UsageTable, types: ClassTypes, threshold: float, most: int) -> np.ndarray:
    """[*usage] F_S(u) [U8]: the most micro-batches a pipeline of usage ≤ u that spans two machines
    or more runs within `threshold`. A usage that fits one machine (Σ_k ⌈u_k/size_k⌉ = 1) was
    priced with no hop ([U3]); spanning, it pays one more, so it runs F at threshold − hop."""
    spans = machines_spanned(types).ravel()
    own = np.minimum(_most_runs(table, threshold), most)
    hopped = np.minimum(_most_runs(table, threshold - types.hop), most)
    return _closed(np.where(spans >= 2, own, hopped).reshape(table.dims))


def _most_runs(table: UsageTable, threshold: float) -> np.ndarray:
    """[U] max over breakpoints of ⌊(v − least[b, u])/b⌋ + 1 (0 where none fits), in blocks of
    breakpoints (a [K, U] float64 temporary is 150 MB on hetero-2); the last few answers are kept
    on the table, since the search asks the same of one bare table for D after D."""
    if threshold not in table.runs:
        _keep(table, threshold, _runs_within(table.b, table.least, threshold))
    return table.runs[threshold]


def _runs_within(b: np.ndarray, least: np.ndarray, threshold: float) -> np.ndarray:
    """[U] max over the breakpoints `b` of ⌊(v − least[b, u])/b⌋ + 1 (0 where none fits)."""
    runs = np.zeros(least.shape[1])
    for lo in range(0, int(np.searchsorted(b, threshold, side="right")), RUN_BLOCK):
        room = threshold - least[lo:lo + RUN_BLOCK].astype(np.float64)
        with np.errstate(invalid="ignore"):
            block = np.where(room >= 0, np.floor(room / b[lo:lo + RUN_BLOCK, None] * (1 + SLACK)) + 1, 0)
        np.maximum(runs, block.max(axis=0), out=runs)
    return runs


def _keep(table: UsageTable, key, value) -> None:
    """Keep an answer on the table, dropping the oldest beyond RUNS_KEPT."""
    while len(table.runs) >= RUNS_KEPT:
        table.runs.pop(next(iter(table.runs)))
    table.runs[key] = value


RUN_BLOCK = 64  # breakpoints per block of `_most_runs`
RUNS_KEPT = 6  # answers a table keeps: [U8] asks at v, v − hop and v − the crossing floor; [U9] by setting class at v


def columns(best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(usages [J, classes], capacities [J]) where F steps up: F(u) > F(u − e_k) for every k."""
    steps = best >= 1
    for axis in range(best.ndim):
        lower = np.concatenate([np.zeros_like(np.take(best, [0], axis=axis)),
                                np.take(best, range(best.shape[axis] - 1), axis=axis)], axis=axis)
        steps &= best > lower
    where = np.argwhere(steps)
    return where, best[steps].astype(float)


def refuted(table: UsageTable, pipelines: int, micro: int, threshold: float, rent: Rent | None = None) -> bool:
    """True when no D pipelines of this table fit the classes (and the budget) with Σ F ≥ B/b [U2];
    with a crossing table, also when that holds for every set Z of classes with a machine all
    pipelines use [U9], [U10]."""
    most = micro - pipelines + 1
    if _refutes(capacities(table, threshold, most), table, pipelines, micro, rent):
        return True
    sets = class_sets(table, pipelines)  # each F_Z ≤ F: a threshold F refutes needs no split
    if sets is None:
        return False
    for z in sorted(sets, key=lambda z: z != table.hints.get("open set")):  # the set that held last, first
        if not _refutes_split(used_class_families(table, z, threshold, most), z.room, table, pipelines, micro, rent):
            table.hints["open set"] = z
            return False
    return True


def refuted_in_case(table: UsageTable, case: Shared, pipelines: int, micro: int, threshold: float,
                    rent: Rent | None = None) -> bool:
    """True when no D pipelines of this table in one case of [U10] reach Σ F ≥ B/b: [U2] (which
    holds for every case) or the case's own split."""
    most = micro - pipelines + 1
    if _refutes(capacities(table, threshold, most), table, pipelines, micro, rent):
        return True
    return _refutes_split(used_class_families(table, case, threshold, most), case.room, table, pipelines, micro, rent)


SPLIT_MILP_SECONDS = 2.0  # per set Z: past it HiGHS's dual bound decides (valid, if weaker); 16 sets on hetero-2


def _refutes(best: np.ndarray, table: UsageTable, pipelines: int, micro: int, rent: Rent | None,
             seconds: float | None = None) -> bool:
    """[U2] on capacities F: no D columns within the classes (and the budget) reach B/b (the
    integer programme stopped after `seconds`, MILP_SECONDS if None)."""
    usage, cap = columns(best)
    return _no_d_columns_reach(usage, cap, _devices(table), pipelines, micro, rent, seconds=seconds)


def _devices(table: UsageTable) -> np.ndarray:
    return np.array(table.dims) - 1


def runs_refuted(b: np.ndarray, least: np.ndarray, dims: tuple[int, ...], threshold: float, pipelines: int,
                 micro: int) -> bool:
    """[U2] on bubbles least [K, U] that are not a usage table's (one layout of [U12]): no D
    pipelines of these usages (dims: N_k + 1 per class) reach B/b within `threshold`."""
    most = micro - pipelines + 1
    usage, cap = columns(_closed(np.minimum(_runs_within(b, least, threshold), most).reshape(dims)))
    return _no_d_columns_reach(usage, cap, np.array(dims) - 1, pipelines, micro, None)


def _no_d_columns_reach(usage: np.ndarray, cap: np.ndarray, devices: np.ndarray, pipelines: int, micro: int,
                        rent: Rent | None, rows: Rows | None = None, seconds: float | None = None) -> bool:
    """[U2] on columns (usage, F) within `devices` per class and extra `rows`: the LP relaxation
    first, then the integer programme."""
    if not len(cap):
        return True
    if cap.max() * pipelines < micro - 1e-9:
        return True
    if np.floor(_most_micro(usage, cap, devices, pipelines, rent, integral=False, rows=rows)[0] + 1e-6) < micro:
        return True  # the LP relaxation's optimum is at least the integer one's
    return np.floor(_most_micro(usage, cap, devices, pipelines, rent, rows=rows, seconds=seconds)[0] + 1e-6) < micro


MAX_CLASS_SETS = 64  # [U9] tests one integer programme per set Z


class Shared(NamedTuple):
    """A case of [U9]/[U10]: per class, how many of its machines every pipeline has a device of
    (0: none, so the class is not in Z), and the most room beyond one device per pipeline there."""

    count: tuple[int, ...]
    room: tuple[int, ...]


def class_sets(table: UsageTable, pipelines: int) -> list[Shared] | None:
    """Every case of machines all D pipelines use: per class 0 … its machines of ≥ D devices, the
    largest count standing for 'at least that many' (room: all of them) where the cases would
    exceed MAX_CLASS_SETS; None when the table has no crossing part or even 0/≥ 1 are too many."""
    if table.crossing is None:
        return None
    eligible = (table.room >= 0).sum(axis=1) - 1  # [class] machines of ≥ D devices
    for cut in range(int(eligible.max(initial=0)), 0, -1):
        levels = [range(min(int(e), cut) + 1) for e in eligible]
        if np.prod([len(r) for r in levels]) <= MAX_CLASS_SETS:
            top = [int(table.room[k, e]) for k, e in enumerate(eligible)]
            return [Shared(count, tuple(int(table.room[k, c]) if c < cut else top[k] for k, c in enumerate(count)))
                    for count in itertools.product(*levels)]
    return None if eligible.max(initial=0) > 0 else [Shared((0,) * len(eligible), (0,) * len(eligible))]


@dataclass(frozen=True)
class Family:
    """Capacities F [*usage] of the pipelines whose stage that sets b sits as one kind [U10]: with
    `charge` > 0, on a machine of class `cls` that every pipeline uses, holding ≥ charge + 1 of its
    devices (the other pipelines hold ≥ 1 each there); with `charge` 0, anywhere else."""

    best: np.ndarray
    cls: int = -1
    charge: int = 0


def used_class_families(table: UsageTable, shared: Shared, threshold: float, most: int) -> list[Family]:
    """F_Z [U9] split by the width of the stage that sets b [U10] (docs/bounds.md §6).

    Z: the classes with a machine every pipeline uses (`shared.count` of them, each ≥ 1). A usage
    with fewer devices of a class than its shared machines is no pipeline of such a plan (F = 0).
    At a breakpoint none of whose setting classes is in Z, the stage that sets b is on a machine
    some pipeline lacks, so its layers' rings leave that machine: the crossing table prices it.
    Where it does not cross, it is on a shared machine of a class k in Z, on ≥ t devices (t = the
    least width of class k's stages whose τ equals b): the free family holds t = 1 and the
    crossing entries, a family (k, t ≥ 2) the rest, charged t − 1 of k's room."""
    used = [k for k, c in enumerate(shared.count) if c]
    signatures, runs = _runs_by_setting_class(table, threshold)
    free = np.zeros(table.least.shape[1])
    wide: dict[tuple[int, int], np.ndarray] = {}
    for signature, (own, crossing) in zip(signatures, runs):
        np.maximum(free, own if (signature[used] == 1).any() else crossing, out=free)
        for k in used:
            if signature[k] >= 2:
                key = (k, int(signature[k]))
                np.maximum(wide.setdefault(key, np.zeros_like(free)), own, out=wide[key])
    fewest = np.array(shared.count)
    families = [Family(_at_least(free, table.dims, fewest, most))]
    for (k, t), best in sorted(wide.items()):
        local = fewest.copy()
        local[k] += t - 1  # t on its own shared machine, ≥ 1 on each other
        families.append(Family(_at_least(best, table.dims, local, most), cls=k, charge=t - 1))
    return families


def _at_least(best: np.ndarray, dims: tuple[int, ...], fewest: np.ndarray, most: int) -> np.ndarray:
    """[*usage] capacities capped at `most`, 0 on usages with fewer than `fewest` devices of a
    class, then closed (devices may stay idle)."""
    best = np.minimum(best, most).reshape(dims)
    for k, n in enumerate(fewest):
        below = [slice(None)] * best.ndim
        below[k] = slice(0, int(n))
        best[tuple(below)] = 0
    return _closed(best)


def _refutes_split(families: list[Family], room: tuple[int, ...], table: UsageTable, pipelines: int, micro: int,
                   rent: Rent | None) -> bool:
    """[U2] over the columns of every family [U10]: a charged family's column counts only where it
    beats the free family at its usage, and takes its charge from its class's room row."""
    free = families[0].best
    usages, caps, charges, classes = [], [], [], []
    for family in families:
        usage, cap = columns(family.best)
        if family.charge:
            keep = cap > free[tuple(usage.T)]
            usage, cap = usage[keep], cap[keep]
        usages.append(usage), caps.append(cap)
        charges.append(np.full(len(cap), family.charge)), classes.append(np.full(len(cap), family.cls))
    charge, of_class = np.concatenate(charges), np.concatenate(classes)
    charged = np.unique(of_class[charge > 0])
    rows = Rows(np.where(of_class[None, :] == charged[:, None], charge[None, :], 0).astype(float),
                np.full(len(charged), -np.inf), np.array(room, dtype=float)[charged]) if len(charged) else None
    return _no_d_columns_reach(np.concatenate(usages), np.concatenate(caps), _devices(table), pipelines, micro, rent,
                               rows=rows, seconds=SPLIT_MILP_SECONDS)


def _runs_by_setting_class(table: UsageTable, threshold: float) -> tuple[np.ndarray, list]:
    """The distinct rows of `table.set_by` and, per row, the runs of the plain and the crossing
    table over the breakpoints with that row (kept like `_most_runs`'s)."""
    key = ("by setting class", threshold)
    if key not in table.runs:
        signatures, which = np.unique(table.set_by, axis=0, return_inverse=True)
        runs = []
        for s in range(len(signatures)):
            rows = np.flatnonzero((which.ravel() == s) & (table.b <= threshold))
            runs.append((_runs_within(table.b[rows], table.least[rows], threshold),
                         _runs_within(table.b[rows], table.crossing[rows], threshold)))
        _keep(table, key, (signatures, runs))
    return table.runs[key]


def refuted_spanning(table: UsageTable, types: ClassTypes, pipelines: int, micro: int, threshold: float,
                     rent: Rent | None = None) -> bool:
    """True when no D pipelines of this table, one of them spanning two machines or more, fit
    the classes (and the budget) with Σ F ≥ B/b [U8]: `refuted`'s programme with columns of
    F_S (`spanning_capacities`) beside those of F, at least one of them chosen."""
    most = micro - pipelines + 1
    usage, cap = columns(capacities(table, threshold, most))
    spanning_usage, spanning_cap = columns(spanning_capacities(table, types, threshold, most))
    if not len(spanning_cap):
        return True
    every_usage = np.concatenate([usage, spanning_usage]) if len(cap) else spanning_usage
    every_cap = np.concatenate([cap, spanning_cap])
    spanning = (np.arange(len(every_cap)) >= len(cap)).astype(float)[None, :]
    return _no_d_columns_reach(every_usage, every_cap, _devices(table), pipelines, micro, rent,
                               rows=Rows(spanning, np.ones(1), np.full(1, np.inf)))


def chosen_usages(table: UsageTable, pipelines: int, micro: int, threshold: float,
                  rent: Rent | None = None) -> list[tuple[int, ...]]:
    """The usages of the D pipelines HiGHS's best solution picks at `threshold` (one entry per
    pipeline, with repeats), or [] when it has none with Σ F ≥ B/b — the plan builder's start."""
    best = capacities(table, threshold, micro - pipelines + 1)
    usage, cap = columns(best)
    if not len(cap):
        return []
    value, x = _most_micro(usage, cap, np.array(table.dims) - 1, pipelines, rent)
    if x is None or np.dot(cap, np.round(x[:len(cap)])) < micro - 1e-6:
        return []
    return [tuple(int(v) for v in usage[j]) for j in range(len(cap)) for _ in range(int(round(x[j])))]


def _most_micro(usage: np.ndarray, cap: np.ndarray, devices: np.ndarray, pipelines: int, rent: Rent | None = None,
                integral: bool = True, rows: Rows | None = None,
                seconds: float | None = None) -> tuple[float, np.ndarray | None]:
    """HiGHS's proven upper bound on the integer programme's optimum (its optimum when solved)
    and its best solution (None: none found; its first len(cap) entries are x); with
    `integral` False, of its LP relaxation (solved in milliseconds where the integer programme
    takes about a second on 700 columns: it refutes most D on its own). `rows`: more rows over the columns
    ([U8], [U10]). `seconds`: HiGHS's time limit (MILP_SECONDS if None)."""
    h = quiet_highs(threads=1)
    h.setOptionValue("time_limit", MILP_SECONDS if seconds is None else seconds)
    h.setOptionValue("mip_rel_gap", 0.0)
    # HiGHS's presolve spent 3.6 of the 5.4 s of one programme of gen-64 seed 1 (4 rows, 1,739
    # columns) and removed 16 columns; off, the programmes of whole bound runs solve 3.3–3.9×
    # faster to the same optima (hetero-1 7B, gen-40 seed 2, h800-h20-16-24; docs/bounds.md [U2′]).
    # Below PRESOLVE_OFF_COLUMNS it pays: there presolve often solves the programme by itself
    if len(cap) >= PRESOLVE_OFF_COLUMNS:
        h.setOptionValue("presolve", "off")
    h.passModel(_model(usage, cap, devices, pipelines, rent, integral, rows))
    h.run()
    status, info = h.getModelStatus(), h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        return -np.inf, None
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    solution = np.array(h.getSolution().col_value) if has else None
    if not integral and status != highspy.HighsModelStatus.kOptimal:
        return np.inf, solution  # an LP proves its maximum only when solved
    return _proven_upper_bound(status, info, has), solution


def _model(usage: np.ndarray, cap: np.ndarray, devices: np.ndarray, pipelines: int, rent: Rent | None,
           integral: bool, rows: Rows | None = None) -> highspy.HighsLp:
    """max Σ F·x: x_j pipelines of usage column j (rows: devices per class, Σ x = D, and `rows`:
    [U8]'s Σ of the spanning columns ≥ 1, [U10]'s charges within the room); with a budget also y_k machines rented per class
    (rows: Σ_j u_jk·x_j − size_k·y_k ≤ 0, Σ rent·y ≤ budget) [U6]."""
    inf, n, classes = highspy.kHighsInf, len(cap), len(devices)
    matrix = np.concatenate([usage.T, np.ones((1, n))]).astype(float)  # [classes + 1, n]
    upper = np.concatenate([devices.astype(float), [float(pipelines)]])
    lower = np.concatenate([np.full(classes, -inf), [float(pipelines)]])
    if rows is not None:
        matrix = np.concatenate([matrix, rows.matrix])
        upper, lower = np.concatenate([upper, rows.upper]), np.concatenate([lower, rows.lower])
    cost, col_upper = cap.astype(float), np.full(n, float(pipelines))
    if rent is not None:
        y = np.concatenate([np.zeros((matrix.shape[0], classes)), -np.diag(rent.size.astype(float)),
                            rent.least_rent[None, :]])
        matrix = np.concatenate([np.concatenate([matrix, usage.T.astype(float), np.zeros((1, n))]), y], axis=1)
        upper = np.concatenate([upper, np.zeros(classes), [rent.budget]])
        lower = np.concatenate([lower, np.full(classes + 1, -inf)])
        cost, col_upper = np.concatenate([cost, np.zeros(classes)]), np.concatenate([col_upper, rent.machines])
    lp = highspy.HighsLp()
    lp.num_row_, lp.num_col_ = matrix.shape
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, np.zeros(lp.num_col_), col_upper.astype(float)
    lp.row_lower_, lp.row_upper_ = lower, upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(0, matrix.size + 1, matrix.shape[0])
    lp.a_matrix_.index_ = np.tile(np.arange(matrix.shape[0]), lp.num_col_)
    lp.a_matrix_.value_ = matrix.T.ravel()
    lp.sense_ = highspy.ObjSense.kMaximize
    if integral:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * lp.num_col_
    return lp


STOPPED_EARLY = ("kTimeLimit", "kIterationLimit", "kSolutionLimit", "kInterrupt")


def _proven_upper_bound(status, info, has_solution: bool) -> float:
    """What the solve proves about the maximum: the optimum when solved; HiGHS's dual bound when
    it stopped at a limit and that bound is finite and not below its own best solution (a
    maximum's bound cannot be); +inf (proves nothing, refutes nothing) in every other case. A
    status without a proof must never refute: a dual bound read after an unfinished or failed
    solve once refuted, in one long benchmark process, thresholds that real plans reach."""
    if status == highspy.HighsModelStatus.kOptimal:
        return float(info.objective_function_value)
    bound = float(info.mip_dual_bound)
    if status.name not in STOPPED_EARLY or not np.isfinite(bound):
        return np.inf
    if has_solution and bound < float(info.objective_function_value) - 1e-6:
        return np.inf
    return bound
