"""The configuration LP of one D at one threshold v, by column generation, and its
certificate (docs/bounds.md §3–§4).

Master: max Σ_j m_j(v)·x_j over relaxed pipelines j, Σ_j usage_j·x_j ≤ devices per class,
Σ_j x_j ≤ D, x ≥ 0, where m_j(v) is the most micro-batches pipeline j runs within v. Every
plan with D pipelines and T ≤ v gives a solution of value B/b. *Certificate*: for any prices
π ≥ 0, the LP value is at most π·N + D·max(0, ρ̄) where ρ̄ bounds every column's reduced cost
m_j(v) − π·usage_j; ρ̄ comes from the pricing's Lagrangian bound [P3], so when
π·N + D·max(0, ρ̄) < B/b, no plan with D pipelines has T ≤ v — whatever columns the
restricted master happened to hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import highspy
import numpy as np

from solvers.layered.bound.classes import ClassTypes
from solvers.layered.bound.pricing import Column, breakpoints, price, read_column
from solvers.milp_backend import quiet_highs

# Lagrange multipliers tried per breakpoint b, as θ = λ·b ([P3]); any set is valid
THETAS = np.array([0.0, 0.5, 0.8, 0.9, 1.0, 1.2, 1.6])
# per-device multipliers of the class-usage limit, as α·(B/b)/N ([P4]); α = 0 drops the limit
ALPHAS = np.array([0.0, 1.0, 4.0, 16.0])
MAX_ROUNDS = 40  # column-generation rounds per threshold
NEW_COLUMNS = 4  # breakpoints read back per round


@dataclass
class Master:
    """One D's column pool (kept across thresholds) and its certificates."""

    types: ClassTypes
    columns: list[Column] = field(default_factory=list)
    seen: set = field(default_factory=set)

    @property
    def most_micro(self) -> int:
        return self.types.micro_batches - self.types.pipelines + 1  # the others run ≥ 1 each

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
        least_bubble = price(self.types, b, np.zeros(len(self.types.devices)), np.ones(len(b))).value
        if not np.isfinite(least_bubble).any() or least_bubble.min() > threshold:
            return True
        for _ in range(MAX_ROUNDS):
            value, prices, pipes_dual = self._solve_lp(threshold)
            if value >= need - 1e-9:
                return False
            bound, best_k = self._certificate(threshold, b, least_bubble, prices)
            if bound < need - 1e-7:
                return True
            added = [self.add(self._column(b, k, prices)) for k in best_k]
            if not any(added):
                return False
        return False

    def _certificate(self, v: float, b: np.ndarray, least_bubble: np.ndarray,
                     prices: np.ndarray) -> tuple[float, list[tuple[int, float, float]]]:
        """π·N + D·max(0, ρ̄) and the breakpoints (with their best θ and α) whose bound is
        largest. Only breakpoints whose cheap bound (θ = 0, α = 0) exceeds the reduced cost
        that would still certify are refined [P3]."""
        most = np.minimum(self.most_micro, np.floor((v - least_bubble) / b * (1 + 1e-9)) + 1)  # [K]
        fits = np.isfinite(least_bubble) & (most >= 1)
        need = (self.types.micro_batches - float(prices @ self.types.devices)) / self.types.pipelines
        rough = most - price(self.types, b, prices, np.zeros(len(b))).value
        live = np.flatnonzero(fits & (rough > need - 1e-7))
        if not len(live):
            return float(prices @ self.types.devices) + self.types.pipelines * max(0.0, float(
                np.max(np.where(fits, rough, -np.inf), initial=0.0))), []
        per_k, picks = self._refine(v, b[live], most[live], prices)
        rest = fits.copy()
        rest[live] = False  # the breakpoints not refined keep their cheap bound
        rho = max(0.0, float(per_k.max()), float(np.max(np.where(rest, rough, -np.inf), initial=0.0)))
        order = np.argsort(-per_k)[:NEW_COLUMNS]
        chosen = [(int(live[k]),) + picks[k] for k in order if np.isfinite(per_k[k])]
        return float(prices @ self.types.devices) + self.types.pipelines * rho, chosen

    def _refine(self, v: float, b: np.ndarray, most: np.ndarray, prices: np.ndarray):
        """[P3] per breakpoint: max over m ≤ most of min over (θ, α) of the Lagrangian bound
        m + λ(v − (m − 1)·b) − [g(π + ν, λ) − ν·N], λ = θ/b, ν = α·(B/b)/N per device."""
        m = np.arange(1, self.most_micro + 1)[None, :]
        best = np.full((len(b), m.shape[1]), np.inf)
        arg = np.zeros((len(b), m.shape[1], 2))
        unit = self.types.micro_batches / float(self.types.devices.sum())
        for alpha in ALPHAS:
            nu = np.full(len(prices), alpha * unit)
            for theta in THETAS:
                lam = theta / b
                g = price(self.types, b, prices + nu, lam).value - float(nu @ self.types.devices)
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

    def _solve_lp(self, threshold: float) -> tuple[float, np.ndarray, float]:
        """The restricted master's value, its class prices π ≥ 0 and the pipeline row's dual."""
        classes = len(self.types.devices)
        caps = [c.capacity(threshold, self.most_micro) for c in self.columns]
        kept = [(c, m) for c, m in zip(self.columns, caps) if m >= 1]
        if not kept:
            return 0.0, np.zeros(classes), 0.0
        return _lp(kept, self.types.devices, self.types.pipelines)


def _lp(kept: list[tuple[Column, int]], devices: np.ndarray, pipelines: int) -> tuple[float, np.ndarray, float]:
    inf = highspy.kHighsInf
    n, rows = len(kept), len(devices) + 1
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, rows
    lp.col_cost_ = np.array([float(m) for _, m in kept])
    lp.col_lower_, lp.col_upper_ = np.zeros(n), np.full(n, inf)
    lp.row_lower_ = np.full(rows, -inf)
    lp.row_upper_ = np.concatenate([devices.astype(float), [float(pipelines)]])
    matrix = np.array([list(c.usage) + [1] for c, _ in kept], dtype=float).T  # [rows, n]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(0, rows * n + 1, rows)
    lp.a_matrix_.index_ = np.tile(np.arange(rows), n)
    lp.a_matrix_.value_ = matrix.T.ravel()
    lp.sense_ = highspy.ObjSense.kMaximize
    h = quiet_highs(threads=1)
    h.passModel(lp)
    h.run()
    duals = np.abs(np.array(h.getSolution().row_dual))
    return float(h.getInfo().objective_function_value), duals[:-1], float(duals[-1])
