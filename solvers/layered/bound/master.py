"""The configuration LP of one D at one threshold v, by column generation, and its
certificate (docs/bounds.md §3–§4).

Master: max Σ_j m_j(v)·x_j over relaxed pipelines j, Σ_j usage_j·x_j ≤ devices per class,
Σ_j x_j = D (then, where that stalls, ≤ D), x ≥ 0, where m_j(v) is the most micro-batches
pipeline j runs within v. Every plan with D pipelines and T ≤ v gives a solution of value B/b
with Σ_j x_j = D. *Certificate*: for any prices π ≥ 0, that value is at most π·N + D·ρ̄ where
ρ̄ (of either sign) bounds every column's reduced cost m_j(v) − π·usage_j; ρ̄ comes from the
pricing's Lagrangian bound [P3], so when π·N + D·ρ̄ < B/b, no plan with D pipelines has
T ≤ v — whatever columns the restricted master happened to hold. Under a budget the master
has one more row, Σ_j (r·usage_j)·x_j ≤ budget (r: each class's least price per device-hour),
and its dual μ moves into the prices (π + μ·r) and the constant (+ μ·budget) [P5]. One
certificate may cover a range of D [P6], and D pipelines that need more devices (or rent) than
there are are refuted before any LP [P7] (docs/bounds.md §4a).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import highspy
import numpy as np

from solvers.layered.bound.classes import ClassTypes
from solvers.layered.bound.pricing import ROLES, Column, StageFrame, breakpoints, price, read_column, stage_contribution
from solvers.layered.bound.usage import widest_stage_sync
from solvers.milp_backend import quiet_highs

# Lagrange multipliers tried per breakpoint b, as θ = λ·b ([P3]); any set is valid
THETAS = np.array([0.0, 0.5, 0.8, 0.9, 1.0, 1.2, 1.6])
# per-device multipliers of the class-usage limit, as α·(B/b)/N ([P4]); α = 0 drops the limit
ALPHAS = np.array([0.0, 1.0, 4.0, 16.0])
MAX_ROUNDS = 40  # column-generation rounds per threshold
NEW_COLUMNS = 4  # breakpoints read back per round
# the restricted master's artificial pipeline costs this many times its best column's micro-batches
ARTIFICIAL = 10.0


@dataclass
class Master:
    """One D's column pool (kept across thresholds) and its certificates."""

    types: ClassTypes
    budget: float | None = None  # rent per hour a plan may spend, with the planner's slack ([P5])
    fewest: int | None = None  # the least D the certificate covers (None: types.pipelines only) [P6]
    deadline: float = math.inf  # perf_counter: past it, column generation stops (refutes nothing more)
    columns: list[Column] = field(default_factory=list)
    seen: set = field(default_factory=set)

    @property
    def device_price(self) -> np.ndarray | None:
        """[class] r: the least price per device-hour (an unpriced class is free: still a
        lower bound on what a plan pays), or None without a budget."""
        if self.budget is None:
            return None
        return np.nan_to_num(self.types.device_price, nan=0.0)

    @property
    def least_pipelines(self) -> int:
        return self.types.pipelines if self.fewest is None else self.fewest

    @property
    def most_micro(self) -> int:
        return self.types.micro_batches - self.least_pipelines + 1  # the others run ≥ 1 each

    def _pipelines_times(self, rho: float) -> float:
        """max over the D covered of D·ρ̄ (Σ x = D, its dual free)."""
        return (self.types.pipelines if rho >= 0 else self.least_pipelines) * rho

    def add(self, column: Column | None) -> bool:
        if column is None or column.stages in self.seen:
            return False
        self.seen.add(column.stages)
        self.columns.append(column)
        return True

    def refuted(self, threshold: float) -> bool:
        """True when the certificate proves that no plan with D pipelines has T ≤ threshold;
        False when column generation stalls or the LP reaches B/b."""
        need = self.types.micro_batches
        b = breakpoints(self.types, threshold)
        if not len(b):
            return True  # not even one stage time fits under the threshold
        bubbles = Bubbles.of(self.types, b)  # shared by every pricing at this threshold
        least_bubble = bubbles.least(np.zeros(len(self.types.devices)), np.ones(len(b)))
        if not np.isfinite(least_bubble).any() or least_bubble.min() > threshold:
            return True
        if self._too_many(bubbles):
            return True
        for seated in (self.least_pipelines, 0):  # the pipeline row as the plan has it, then as Σ x ≤ D
            outcome = self._generate(threshold, seated, bubbles, least_bubble)
            if outcome is not None:
                return outcome
        return False

    def _generate(self, threshold: float, seated: int, bubbles: Bubbles, least_bubble: np.ndarray) -> bool | None:
        """Column generation with the master's pipeline row at `seated` ≤ Σ x ≤ D: True when the
        certificate refutes the threshold, False when the LP reaches B/b (then no prices can:
        the LP with Σ x ≥ `seated` lies inside the one with Σ x ≥ 0), None when it stalls.
        The rows as a plan has them (Σ x ≥ D₁) steer the prices to charge the devices D
        pipelines need; where the pool cannot seat them yet, the artificial pipeline can leave
        prices no column read back answers (a class of one device priced at 0, the column it
        reads back needing two), so a stall is retried with Σ x ≤ D, the prices of the LP the
        certificate bounds (tiny seed 16: 0.0495 s by the first alone, 0.0561 s with both)."""
        need = self.types.micro_batches
        for _ in range(MAX_ROUNDS):
            if time.perf_counter() > self.deadline:
                return None  # a stall: nothing refuted (1,024 GPUs ran 13 s of a 5 s solve in these rounds)
            value, prices, constant = self._solve_lp(threshold, seated)
            if value >= need - 1e-9:
                return False
            bound, best_k = self._certificate(threshold, bubbles, least_bubble, prices, constant)
            if bound < need - 1e-7:
                return True
            added = [self.add(self._column(bubbles.b, k, prices)) for k in best_k]
            if not any(added):
                return None
        return None

    def _too_many(self, bubbles: Bubbles) -> bool:
        """Whether D pipelines cannot all be: each needs at least the fewest devices (and the
        least rent) of any relaxed pipeline with every τ ≤ b ≤ v, and D times that exceeds the
        devices (the budget) [P7]."""
        b, frame, zero = bubbles.b, bubbles.frame, np.zeros(len(bubbles.b))
        fewest = price(self.types, b, np.ones(len(self.types.devices)), zero, frame, False).value.min()
        if self.least_pipelines * fewest > self.types.devices.sum():
            return True
        rate = self.device_price
        return rate is not None and self.least_pipelines * price(
            self.types, b, rate, zero, frame, False).value.min() > self.budget * (1 + 1e-9)

    def _certificate(self, v: float, bubbles: Bubbles, least_bubble: np.ndarray,
                     prices: np.ndarray, constant: float) -> tuple[float, list[tuple[int, float, float]]]:
        """constant + D·ρ̄ (constant = π·N, + μ·budget [P5]; `prices` per device, the
        budget's μ·r included) and the breakpoints (with their best θ and α) whose bound is
        largest. Only breakpoints whose cheap bound (θ = 0, α = 0) exceeds the reduced cost
        that would still certify are refined [P3]."""
        b = bubbles.b
        most = np.minimum(self.most_micro, np.floor((v - least_bubble) / b * (1 + 1e-9)) + 1)  # [K]
        fits = np.isfinite(least_bubble) & (most >= 1)
        room = self.types.micro_batches - constant
        need = room / (self.types.pipelines if room > 0 else self.least_pipelines)  # ρ̄ below it certifies
        rough = most - price(self.types, b, prices, np.zeros(len(b)), bubbles.frame, False).value
        live = np.flatnonzero(fits & (rough > need - 1e-7))
        if not len(live):
            return constant + self._pipelines_times(float(np.max(np.where(fits, rough, -np.inf)))), []
        per_k, picks = self._refine(v, bubbles.rows(live), most[live], prices)
        rest = fits.copy()
        rest[live] = False  # the breakpoints not refined keep their cheap bound
        # ρ̄ may be negative: a plan has exactly D pipelines (Σ x = D, its dual free) [P3]
        rho = max(float(per_k.max()), float(np.max(np.where(rest, rough, -np.inf), initial=-np.inf)))
        order = np.argsort(-per_k)[:NEW_COLUMNS]
        chosen = [(int(live[k]),) + picks[k] for k in order if np.isfinite(per_k[k])]
        return constant + self._pipelines_times(rho), chosen

    def _refine(self, v: float, bubbles: Bubbles, most: np.ndarray, prices: np.ndarray):
        """[P3] per breakpoint: max over m ≤ most of min over (θ, α) of the Lagrangian bound
        m + λ(v − (m − 1)·b) − [g(π + ν, λ) − ν·N], λ = θ/b, ν = α·(B/b)/N per device."""
        b = bubbles.b
        m = np.arange(1, self.most_micro + 1)[None, :]
        best = np.full((len(b), m.shape[1]), np.inf)
        arg = np.zeros((len(b), m.shape[1], 2))
        unit = self.types.micro_batches / float(self.types.devices.sum())
        for alpha in ALPHAS:
            nu = np.full(len(prices), alpha * unit)
            for theta in THETAS:
                lam = theta / b
                g = bubbles.least(prices + nu, lam) - float(nu @ self.types.devices)
                ub = m + lam[:, None] * (v - (m - 1) * b[:, None]) - g[:, None]
                better = ub < best
                arg[better] = (theta, alpha)
                best = np.minimum(best, ub)
        best = np.where(m <= most[:, None], best, -np.inf)
        top = best.argmax(axis=1)
        return best.max(axis=1), [tuple(arg[k, top[k]]) for k in range(len(b))]

    def _column(self, b: np.ndarray, pick: tuple[int, float, float], prices: np.ndarray) -> Column | None:
        """The relaxed pipeline behind a breakpoint's bound (it may use more devices of a class
        than there are: the LP then takes a fraction of it, a relaxation that only weakens the
        restricted master, never the certificate)."""
        k, theta, alpha = pick
        unit = self.types.micro_batches / float(self.types.devices.sum())
        priced = price(self.types, b[k:k + 1], prices + alpha * unit, np.array([max(theta, 1e-3) / b[k]]))
        return read_column(self.types, priced, 0)

    def _solve_lp(self, threshold: float, seated: int) -> tuple[float, np.ndarray, float]:
        """The restricted master's value (pipeline row `seated` ≤ Σ x ≤ D), the prices per device
        π + μ·r (π ≥ 0 the class rows' duals, μ ≥ 0 the budget row's) and the certificate's
        constant π·N + μ·budget."""
        classes = len(self.types.devices)
        caps = [c.capacity(threshold, self.most_micro) for c in self.columns]
        kept = [(c, m) for c, m in zip(self.columns, caps) if m >= 1]
        if not kept:
            return 0.0, np.zeros(classes), 0.0
        rate = self.device_price
        value, duals = _lp(kept, self.types.devices, (seated, self.types.pipelines), rate, self.budget)
        prices, constant = duals[:classes], float(duals[:classes] @ self.types.devices)
        if rate is not None:
            prices, constant = prices + duals[classes] * rate, constant + duals[classes] * self.budget
        return value, prices, constant


@dataclass(frozen=True)
class Bubbles:
    """The pricing g_b(π, λ) of one threshold's breakpoints b, with [U4] (a) for D ≥ 2: a pipeline
    whose largest stage time is b pays at least the sync floor w(b) of a stage with τ = b, so
    its bubble is at least the bubble without any sync floor plus w(b), as well as the bubble
    with its last stage's floors; g is the larger of the two pricings (each column is counted
    at its own b in [P3], where both hold)."""

    types: ClassTypes
    b: np.ndarray
    frame: StageFrame
    bare: ClassTypes | None = None  # the types without sync floors (D = 1: None, nothing to add)
    bare_frame: StageFrame | None = None
    widest: np.ndarray | None = None  # [K] w(b)

    @classmethod
    def of(cls, types: ClassTypes, b: np.ndarray) -> Bubbles:
        frame = StageFrame.of(types, b)
        if types.pipelines < 2:
            return cls(types, b, frame)
        bare = replace(types, sync_layer=np.zeros_like(types.sync_layer), sync_head=np.zeros_like(types.sync_head))
        bare_frame = StageFrame(contribution={r: stage_contribution(bare, r) for r in ROLES}, blocked=frame.blocked)
        return cls(types, b, frame, bare, bare_frame, widest_stage_sync(types, b))

    def least(self, prices: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """[K] g_b(π, λ) (values only)."""
        g = price(self.types, self.b, prices, lam, self.frame, False).value
        if self.bare is None:
            return g
        return np.maximum(g, price(self.bare, self.b, prices, lam, self.bare_frame, False).value + lam * self.widest)

    def rows(self, keep: np.ndarray) -> Bubbles:
        """The same for some of the breakpoints."""
        if self.bare is None:
            return Bubbles(self.types, self.b[keep], self.frame.rows(keep))
        return Bubbles(self.types, self.b[keep], self.frame.rows(keep), self.bare, self.bare_frame.rows(keep),
                       self.widest[keep])


def _lp(kept: list[tuple[Column, int]], devices: np.ndarray, pipelines: tuple[int, int], rate: np.ndarray | None,
        budget: float | None) -> tuple[float, np.ndarray]:
    """max Σ m_j·x_j under the class rows, the budget row (where `rate` is given: Σ_j
    (rate·usage_j)·x_j ≤ budget) and D₁ ≤ Σ x_j ≤ D₂ (`pipelines`); its value and its rows'
    duals (the class and budget rows' ≥ 0, the pipeline row's last, of either sign).

    A plan has exactly D pipelines, and the pipeline row held as Σ x ≤ D left its dual at 0
    wherever the pool's pipelines reach B/b with fewer: gen-128 seed 0 at D = 34 used 7.5 of
    them, and the prices it gave certified only 5.48 s; held as an equality the prices charge
    the devices the D pipelines need, 6.31 s. An artificial column (no devices, no
    micro-batches, cost ARTIFICIAL per pipeline) keeps the master feasible while the pool
    cannot yet seat D pipelines (phase 1 of the simplex's big-M): the certificate is computed
    over every real pipeline whatever the duals, so it only steers π."""
    inf = highspy.kHighsInf
    usage = np.array([c.usage for c, _ in kept] + [np.zeros(len(devices))], dtype=float)  # [n, classes]
    limits = [devices.astype(float)]
    if rate is not None:
        usage = np.column_stack([usage, usage @ rate])
        limits.append([float(budget)])
    n, rows = len(kept) + 1, usage.shape[1] + 1
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, rows
    lp.col_cost_ = np.array([float(m) for _, m in kept] + [-ARTIFICIAL * max(m for _, m in kept)])
    lp.col_lower_, lp.col_upper_ = np.zeros(n), np.full(n, inf)
    lp.row_lower_ = np.concatenate([np.full(rows - 1, -inf), [float(pipelines[0])]])
    lp.row_upper_ = np.concatenate(limits + [[float(pipelines[1])]])
    matrix = np.column_stack([usage, np.ones(n)]).T  # [rows, n]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(0, rows * n + 1, rows)
    lp.a_matrix_.index_ = np.tile(np.arange(rows), n)
    lp.a_matrix_.value_ = matrix.T.ravel()
    lp.sense_ = highspy.ObjSense.kMaximize
    h = quiet_highs(threads=1)
    h.passModel(lp)
    h.run()
    duals = np.array(h.getSolution().row_dual)
    duals[:-1] = np.abs(duals[:-1])
    return float(h.getInfo().objective_function_value), duals
