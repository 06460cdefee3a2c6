"""The MILP's valid cuts and a fixed structure, [M13]–[M16] (docs/formulation.md §2.2, §4):
rows the LP relaxation needs to be tight, added to the model's own families (`milp_model`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pulp

from solvers.layered.exact.milp_model import LayoutVars, MilpBuilder, SyncVars, TimeVars


@dataclass(frozen=True)
class CutVars:
    """[M14]/[M15]: the variables of the valid cuts."""

    busy: dict  # (p, ℓ, c) → y = m_p·z [M14]
    allocation: dict  # p → [x[p, a]] one-hot over allocations [M15]
    micro_is: dict  # p → [mm[p, m]] = [m_p = m], m = 1.. [M15]


class MilpCutBuilder(MilpBuilder):
    """The model's families and, on top, the cuts and the structure of a candidate."""

    # -- [M13]–[M15] valid cuts ------------------------------------------------------------
    def capacity_cuts(self, total, layout: LayoutVars, micro: dict) -> dict:
        """[M14] valid cuts the LP relaxation needs: (a) a type holds at most n_max layers per
        stage; (b) every device of machine M is busy m_p·τ_σ ≤ T, so Σ t_σ·m_p·τ_σ ≤ count_M·T,
        written with y[p,ℓ,c] = m_p·z[p,ℓ,c] (exact: y ≤ top·z, Σ_c y = m_p)."""
        tb, big_l, u, z = self.tb, self.tb.layers, self.unit, layout.z
        top = tb.total_micro - self.d + 1
        n_max = tb.n_max_for(self.d)  # ZeRO-1: D's memory
        busy, ys = {k: [] for k in self.K}, {}
        for p in self.P:
            for c in self.C:
                self.add(pulp.lpSum(z[p, l, c] for l in self.L)
                         <= int(n_max[c, 0, 0, 1]) * pulp.lpSum(layout.start[p, l, c] for l in self.L))
            for l in self.L:
                row = {c: self.cont(f"y_{p}_{l}_{c}", 0, top) for c in self.C}
                self.add(pulp.lpSum(row.values()) == micro[p])
                for c, y in row.items():
                    ys[p, l, c] = y
                    self.add(y <= top * z[p, l, c])
                    cost = tb.tau_layer[c] + (tb.tau_head[c] if l == big_l - 1 else 0.0)
                    busy[tb.types[c].machine].append(tb.types[c].tp * cost / u * y)
        for k in self.K:
            self.add(tb.cluster.machines[k].count * total >= pulp.lpSum(busy[k]))
        return ys

    def valid_cuts(self, total, times: TimeVars, sync: SyncVars) -> None:
        """[M13] m_0 ≥ ⌈B/(b·D)⌉ (pipelines are ordered), T_dp's floor, T ≤ the cutoff."""
        m_low = -(-self.tb.total_micro // self.d)
        self.add(total >= times.bubble[0] + (m_low - 1) * times.slowest[0] + sync.t_dp)
        self.add(sync.t_dp >= self.tb.dp_floor(self.d) / self.unit)
        if self.sub.cutoff is not None:
            self.add(total <= self.sub.cutoff / self.unit * (1 + 1e-9))

    def floor_cuts(self, total, layout: LayoutVars, micro: dict) -> tuple[dict, dict]:
        """[M15] valid cuts (docs/formulation.md §4): T ≥ the combinatorial bound of D [B2];
        per pipeline, x[p,a] picks an allocation a ≥ p's device use (floors only fall as a
        grows), mm[p,m] = [m_p = m], and T ≥ Σ_a pipe_floor[m,a]·x[p,a] when mm[p,m] = 1."""
        loose = 1 - 1e-7  # float sums of the same terms may differ in the last digits
        self.add(total >= loose * self.sub.lower_bound / self.unit)
        allocation, micro_is = {}, {}
        if self.sub.floors is None:
            return allocation, micro_is
        table = self._floor_table(loose)
        allocs = list(np.ndindex(*reversed(self.sub.floors.radix)))  # machines reversed, as in the table
        for p in self.P:
            x = allocation[p] = [self.bin(f"xa_{p}_{i}") for i in range(len(allocs))]
            mm = micro_is[p] = [self.bin(f"mm_{p}_{m}") for m in range(1, len(table) + 1)]
            self.add(pulp.lpSum(x) == 1)
            self.add(pulp.lpSum(mm) == 1)
            self.add(pulp.lpSum((i + 1) * v for i, v in enumerate(mm)) == micro[p])
            self._allocation_covers_use(p, layout.start, allocs, x)
            for i, row in enumerate(table):
                self.add(total >= pulp.lpSum(float(row[j]) * v for j, v in enumerate(x) if row[j] > 0)
                         - float(row.max()) * (1 - mm[i]))
        return allocation, micro_is

    def _floor_table(self, loose: float) -> np.ndarray:
        """pipe_floor[m, a] for m = 1..top, in model units; +inf (nothing fits) → any large value."""
        top = self.tb.total_micro - self.d + 1
        table = loose * self.sub.floors.table[1:top + 1] / self.unit
        cap = 10.0 * max(1.0, float(table[np.isfinite(table)].max(initial=1.0)))
        return np.where(np.isfinite(table), table, cap)

    def _allocation_covers_use(self, p: int, start: dict, allocs: list, x: list) -> None:
        tb = self.tb
        for k in self.K:
            use = pulp.lpSum(tb.types[c].tp * start[p, l, c] for l in self.L for c in self.C
                             if tb.types[c].machine == k)
            self.add(pulp.lpSum(a[len(allocs[0]) - 1 - k] * v for a, v in zip(allocs, x) if a) >= use)

    # -- [M16] a fixed structure [B4]/[B5] ---------------------------------------------------
    def structure(self, layout: LayoutVars, micro: dict) -> dict:
        """Pipeline p uses exactly its candidate's stage types (s = z ∧ β exactly, Σ_ℓ s[p,ℓ,c]
        = multiplicity of c) and m_p; with an order, its stages in that order."""
        stage_of: dict = {}
        for p, cand in enumerate(self.sub.structure or ()):
            self.add(micro[p] == cand.micro_batches)
            for c in self.C:
                self._type_multiplicity(p, c, cand.shape.stages.count(c), layout)
            if cand.order is not None:
                self._stage_order(p, cand.order, layout, stage_of)
        return stage_of

    def _type_multiplicity(self, p: int, c: int, times: int, layout: LayoutVars) -> None:
        z, beta, start = layout.z, layout.beta, layout.start
        if not times:
            for l in self.L:
                self.add(z[p, l, c] == 0)
            return
        for l in range(1, self.tb.layers):
            self.add(start[p, l, c] <= z[p, l, c])
            self.add(start[p, l, c] <= beta[p, l])
        self.add(pulp.lpSum(start[p, l, c] for l in self.L) == times)

    def _stage_order(self, p: int, order: tuple[int, ...], layout: LayoutVars, stage_of: dict) -> None:
        """Layer ℓ is in stage k = Σ_{ℓ' ≤ ℓ} β (u[ℓ,k] one-hot), whose type is order[k]."""
        big_l, n_stages, z, beta = self.tb.layers, len(order), layout.z, layout.beta
        self.add(pulp.lpSum(beta[p, l] for l in range(1, big_l)) == n_stages - 1)
        for l in self.L:
            u = stage_of[p, l] = [self.bin(f"u_{p}_{l}_{k}") for k in range(n_stages)]
            self.add(pulp.lpSum(u) == 1)
            self.add(pulp.lpSum(k * v for k, v in enumerate(u)) == pulp.lpSum(beta[p, k] for k in range(1, l + 1)))
            for c in self.C:
                self.add(z[p, l, c] == pulp.lpSum(v for k, v in enumerate(u) if order[k] == c))
