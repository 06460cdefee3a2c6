"""The MILP's variables and its constraint families [M1]–[M12] (docs/formulation.md §2.2):
the layout, micro-batches, memory, stage and pipeline times, data-parallel sync. The valid
cuts and a fixed structure [M13]–[M16] add to these in `milp_cuts`; `milp` builds and solves.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulp

from solvers.layered.exact.subproblem import SubProblem
from solvers.layered.exact.milp_tied import TiedVars, tied_sync
from solvers.layered.exact.spec import in_flight_rule


# -- the variables, one frozen group per family ---------------------------------------------
@dataclass(frozen=True)
class LayoutVars:
    """[M1]–[M5]: which stage type holds each layer and where stages start."""

    z: dict  # (p, ℓ, c) → binary: type c holds layer ℓ of pipeline p [M1]
    beta: dict  # (p, ℓ ≥ 1) → binary: a stage starts at ℓ [M2]
    start: dict  # (p, ℓ, c) → s = z ∧ β (continuous in [0, 1]; z itself at ℓ = 0) [M3]


@dataclass(frozen=True)
class BatchVars:
    """[M6]: micro-batches per pipeline and the binary expansion of m_p − 1."""

    micro: dict  # p → m_p (integer)
    bits: dict  # p → [bit_k]: m_p − 1 = Σ_k 2^k·bit_k


@dataclass(frozen=True)
class MemoryVars:
    """[M7]: position in the stage, "holds layer 0", and the steps of q (§3.5)."""

    position: dict  # (p, ℓ) → cnt
    first: dict  # (p, ℓ) → f (binary)
    micro_at_least: dict  # (p, j) → mge_j ≥ [m_p ≥ j]
    stages_at_least: dict  # (p, ℓ, j) → rge_j ≥ [r ≥ j] (rge_2 = [not last] exactly)
    in_flight_steps: dict  # (p, ℓ, j) → q_j ≥ [q ≥ j] under 1F1B (GPipe uses mge_j)


@dataclass(frozen=True)
class TimeVars:
    """[M8]–[M10]: stage times, pipeline traffic, the 1F1B steady state."""

    slowest: dict  # p → R_p ≥ every τ_k and T_pp,k [M8]/[M9]
    running: dict  # (p, ℓ) → acc: τ of ℓ's stage up to ℓ [M8]
    link: dict  # (p, ℓ ≥ 1) → link part of T_pp [M9]
    bcast: dict  # (p, ℓ ≥ 1) → broadcast part of T_pp [M9]
    steady_terms: dict  # (p, k) → w ≥ bit_k·R_p [M10]
    bubble: dict  # p → Σ τ + Σ T_pp (an expression)
    steady: dict  # p → Σ_k 2^k·w (an expression) = (m_p − 1)·R_p at the optimum


@dataclass(frozen=True)
class SyncVars:
    """[M11]: τ_dp(ℓ) = F + G over the holders of ℓ, and T_dp (all empty but t_dp when D = 1);
    [M17] a tied model's sync."""

    t_dp: pulp.LpVariable
    on_machine: dict  # (ℓ, M) → h1: M holds ℓ
    on_machine_twice: dict  # (ℓ, M) → h2: M holds ℓ for ≥ 2 pipelines (binary)
    tp_occurs: dict  # (ℓ, t) → ht: some holder of ℓ has TP size t
    latency: dict  # ℓ → G
    bandwidth: dict  # (kind, ℓ) → F
    running: dict  # (p, ℓ) → dacc: Σ τ_dp over ℓ's stage up to ℓ
    tied: TiedVars | None  # [M17], None for an untied model


class MilpBuilder:
    """Adds one family of variables and constraints at a time to one problem (one D)."""

    def __init__(self, sub: SubProblem):
        self.sub, self.tb, self.d = sub, sub.tables, sub.pipelines
        self.unit = self.tb.trivial_bound
        self.lp = pulp.LpProblem(f"hexiscale_D{self.d}", pulp.LpMinimize)
        self.P, self.L, self.C = sub.pipeline_range, range(self.tb.layers), range(len(self.tb.types))
        self.K = range(self.tb.num_machines)
        self._count = 0

    def add(self, constraint) -> None:
        self._count += 1
        self.lp += constraint, f"c{self._count}"

    def bin(self, name: str):
        return self.lp.add_variable(name, cat="Binary")

    def cont(self, name: str, low=0.0, up=None):
        return self.lp.add_variable(name, lowBound=low, upBound=up)

    def on_machine(self, z: dict, p: int, l: int, k: int):
        """zm: layer ℓ of pipeline p is on machine k."""
        return pulp.lpSum(z[p, l, c] for c in self.C if self.tb.types[c].machine == k)

    # -- [M1]–[M5] layout: types per layer, stage boundaries, devices --------------------
    def layout(self) -> LayoutVars:
        big_l = self.tb.layers
        z = {(p, l, c): self.bin(f"z_{p}_{l}_{c}") for p in self.P for l in self.L for c in self.C}
        beta = {(p, l): self.bin(f"b_{p}_{l}") for p in self.P for l in range(1, big_l)}
        for p in self.P:
            for l in self.L:  # [M1] one type per layer
                self.add(pulp.lpSum(z[p, l, c] for c in self.C) == 1)
            for l in range(1, big_l):  # [M2] the type changes only at a stage boundary
                for c in self.C:
                    self.add(z[p, l, c] - z[p, l - 1, c] <= beta[p, l])
                    self.add(z[p, l - 1, c] - z[p, l, c] <= beta[p, l])
            # [M5] stages per pipeline
            self.add(pulp.lpSum(beta[p, l] for l in range(1, big_l)) <= self.sub.max_stages - 1)
        start = self._starts(z, beta)
        self._device_limits(start)
        return LayoutVars(z=z, beta=beta, start=start)

    def _starts(self, z: dict, beta: dict) -> dict:
        """[M3] s = z ∧ β: a stage of type c starts at ℓ (s ≥ z + β − 1, s ≥ z − z_prev)."""
        start = {}
        for (p, l, c), zv in z.items():
            if l == 0:
                start[p, l, c] = zv
            else:
                s = self.cont(f"s_{p}_{l}_{c}", 0, 1)
                self.add(s >= zv + beta[p, l] - 1)
                start[p, l, c] = s
        for p in self.P:
            for l in range(1, self.tb.layers):  # a change of type starts a stage (tightens [M3])
                for c in self.C:
                    self.add(start[p, l, c] >= z[p, l, c] - z[p, l - 1, c])
        return start

    def _device_limits(self, start: dict) -> None:
        """[M4] devices per machine."""
        tb = self.tb
        for k in self.K:
            self.add(pulp.lpSum(tb.types[c].tp * start[p, l, c] for p in self.P for l in self.L
                                for c in self.C if tb.types[c].machine == k) <= tb.cluster.machines[k].count)

    # -- [M6] micro-batches, ordered pipelines [R2], binary expansion of m_p − 1 -----------
    def batches(self) -> BatchVars:
        total, d = self.tb.total_micro, self.d
        top = total - d + 1
        micro = {p: self.lp.add_variable(f"m_{p}", 1, top, cat="Integer") for p in self.P}
        self.add(pulp.lpSum(micro.values()) == total)
        for p in range(d - 1):
            self.add(micro[p] >= micro[p + 1])
        bits = {}
        nbits = max(1, (top - 1).bit_length())
        for p in self.P:
            bits[p] = [self.bin(f"mb_{p}_{k}") for k in range(nbits)]
            self.add(micro[p] - 1 == pulp.lpSum((1 << k) * b for k, b in enumerate(bits[p])))
        return BatchVars(micro=micro, bits=bits)

    # -- [M7] memory: cnt ≤ n_max(c, first, last, q), q = min(S − k, m_p) (1F1B) or m_p (GPipe)
    def memory(self, layout: LayoutVars, micro: dict) -> MemoryVars:
        mem = MemoryVars(position={}, first={}, micro_at_least={}, stages_at_least={}, in_flight_steps={})
        gpipe = in_flight_rule(self.tb.training) == "all"
        for p in self.P:
            mge = self._micro_steps(p, micro[p], gpipe)
            for l in self.L:
                self._position(p, l, layout.beta, mem)
                not_last, steps = self._in_flight_steps(p, l, layout.beta, mge, gpipe, mem)
                self._memory_rows(p, l, layout.z, mem, not_last, (mge if gpipe else steps, mge if gpipe else {}))
        return mem

    def _micro_steps(self, p: int, micro, gpipe: bool) -> dict:
        """mge_j ≥ [m_p ≥ j], j = 2..Q (under GPipe only up to m_p's top)."""
        q_top, top = self.tb.q_top, self.tb.total_micro - self.d + 1
        last_j = min(q_top, top) if gpipe else q_top
        mge = {j: self.bin(f"mge_{p}_{j}") for j in range(2, last_j + 1)}
        for j, v in mge.items():
            self.add(v * (top - j + 1) >= micro - j + 1)
        return mge

    def _position(self, p: int, l: int, beta: dict, mem: MemoryVars) -> None:
        """cnt (position in the stage) and f ("the stage holds layer 0")."""
        big_l = self.tb.layers
        cnt = mem.position[p, l] = self.cont(f"cnt_{p}_{l}", 1, big_l)
        f = mem.first[p, l] = self.bin(f"f_{p}_{l}")
        if l == 0:
            self.add(f == 1)
        else:
            self.add(cnt >= mem.position[p, l - 1] + 1 - big_l * beta[p, l])
            self.add(f >= mem.first[p, l - 1] - beta[p, l])

    def _in_flight_steps(self, p: int, l: int, beta: dict, mge: dict, gpipe: bool, mem: MemoryVars):
        """rge_j ≥ [r ≥ j] (rge_2 = [not last] exactly) and, under 1F1B, q_j ≥ rge_j + mge_j − 1
        (q ≥ j iff r ≥ j and m ≥ j). Returns ([not last], the q steps)."""
        q_top, s_top = self.tb.q_top, self.sub.max_stages
        after = pulp.lpSum(beta[p, k] for k in range(l + 1, self.tb.layers))  # r − 1
        if gpipe:  # only [not last] is needed
            top_j = min(2, s_top)
        else:
            top_j = min(q_top, s_top) if s_top < 2 else max(2, min(q_top, s_top))
        rge = {j: self.bin(f"rge_{p}_{l}_{j}") for j in range(2, top_j + 1)}
        for j, v in rge.items():
            self.add(v * (s_top - j + 1) >= after - j + 2)
            mem.stages_at_least[p, l, j] = v
        if 2 in rge:
            self.add(rge[2] <= after)
        steps = {} if gpipe else {j: self.bin(f"q_{p}_{l}_{j}") for j in rge if j <= q_top}
        for j, v in steps.items():
            self.add(v >= rge[j] + mge[j] - 1)
            mem.in_flight_steps[p, l, j] = v
        return rge.get(2, 0), steps

    def _memory_rows(self, p: int, l: int, z: dict, mem: MemoryVars, not_last, steps: tuple[dict, dict]) -> None:
        """cnt ≤ n_max[c, f, last, 1] − Σ_j (n_max[.., j−1] − n_max[.., j])·step_j, one row for
        a middle stage and one for the last, each relaxed by big-M when it does not apply."""
        nm, big = self.tb.n_max_for(self.d), self.tb.layers  # ZeRO-1: D's memory
        cnt, f = mem.position[p, l], mem.first[p, l]
        for c in self.C:
            for first in (0, 1):
                off = big * (1 - z[p, l, c]) + big * ((1 - f) if first else f)
                rows = []
                for last, last_steps in ((0, steps[0]), (1, steps[1])):
                    row = int(nm[c, first, last, 1])
                    if last_steps:
                        row = row - pulp.lpSum(int(nm[c, first, last, j - 1] - nm[c, first, last, j]) * v
                                               for j, v in last_steps.items())
                    rows.append(row)
                self.add(cnt <= rows[0] + off + big * (1 - not_last))
                self.add(cnt <= rows[1] + off + big * not_last)

    # -- [M8]–[M10] stage times, pipeline traffic, 1F1B ------------------------------------
    def pipe_times(self, layout: LayoutVars, bits: dict) -> TimeVars:
        tb, big_l, u = self.tb, self.tb.layers, self.unit
        t1 = [tb.tau_layer[c] / u for c in self.C]
        th = [tb.tau_head[c] / u for c in self.C]
        big_tau = max(big_l * a + b for a, b in zip(t1, th))
        r_top = max(big_tau, float(tb.pp_link.max() + max(tb.pp_bcast.max(), 0.0)) / u)
        times = TimeVars(slowest={}, running={}, link={}, bcast={}, steady_terms={}, bubble={}, steady={})
        for p in self.P:
            slowest = times.slowest[p] = self.cont(f"R_{p}", 0, r_top)
            work = {l: pulp.lpSum(t1[c] * layout.z[p, l, c] for c in self.C) for l in self.L}
            self._stage_times(p, layout.beta, work, big_tau, times)
            head = pulp.lpSum(th[c] * layout.z[p, big_l - 1, c] for c in self.C)
            self.add(slowest >= times.running[p, big_l - 1] + head)
            self._machine_balance(p, layout.z, slowest, (t1, th))
            pp_total = self._traffic(p, layout, times)
            times.bubble[p] = pulp.lpSum(work.values()) + head + pulp.lpSum(pp_total)
            times.steady[p] = self._steady(p, bits[p], slowest, r_top, times)
        return times

    def _stage_times(self, p: int, beta: dict, work: dict, big_tau: float, times: TimeVars) -> None:
        """[M8] running τ inside a stage; R ≥ every stage's τ."""
        for l in self.L:
            acc = times.running[p, l] = self.cont(f"acc_{p}_{l}", 0, big_tau)
            self.add(acc >= work[l])
            if l:
                self.add(acc >= times.running[p, l - 1] + work[l] - big_tau * beta[p, l])
            self.add(times.slowest[p] >= acc)

    def _machine_balance(self, p: int, z: dict, slowest, taus: tuple[list, list]) -> None:
        """[M8'] machine balance: Σ_σ on M t_σ·τ_σ ≤ count_M·R_p (a valid cut)."""
        tb, (t1, th), last = self.tb, taus, self.tb.layers - 1
        for k in self.K:
            on_k = [c for c in self.C if tb.types[c].machine == k]
            self.add(tb.cluster.machines[k].count * slowest >= pulp.lpSum(
                tb.types[c].tp * (t1[c] * pulp.lpSum(z[p, l, c] for l in self.L) + th[c] * z[p, last, c])
                for c in on_k))

    def _traffic(self, p: int, layout: LayoutVars, times: TimeVars) -> list:
        """[M9] T_pp at a boundary = link part + broadcast part; R ≥ T_pp."""
        tb, u, z, beta = self.tb, self.unit, layout.z, layout.beta
        pp_total = []
        for l in range(1, tb.layers):
            a = times.link[p, l] = self.cont(f"ppl_{p}_{l}")
            b = times.bcast[p, l] = self.cont(f"ppb_{p}_{l}")
            for k1 in self.K:
                for k2 in self.K:
                    self.add(a >= tb.pp_link[k1, k2] / u
                             * (self.on_machine(z, p, l - 1, k1) + self.on_machine(z, p, l, k2) + beta[p, l] - 2))
            for c in self.C:
                if tb.pp_bcast[c] > 0:
                    self.add(b >= tb.pp_bcast[c] / u * (z[p, l, c] + beta[p, l] - 1))
            self.add(times.slowest[p] >= a + b)
            pp_total += [a, b]
        return pp_total

    def _steady(self, p: int, bits: list, slowest, r_top: float, times: TimeVars):
        """[M10] (m_p − 1)·R = Σ 2^k·bit_k·R, w_k ≥ R − R_top·(1 − bit_k)."""
        terms = []
        for k, bit in enumerate(bits):
            w = times.steady_terms[p, k] = self.cont(f"w_{p}_{k}", 0, r_top)
            self.add(w >= slowest - r_top * (1 - bit))
            terms.append((1 << k) * w)
        return pulp.lpSum(terms)

    # -- [M11] data-parallel sync: τ_dp(ℓ) = F(t_min, bw_min) + G(α_max); [M17] a tied model's
    def dp_sync(self, layout: LayoutVars) -> SyncVars:
        tied = tied_sync(self, layout) if self.tb.tied else None
        sync = SyncVars(t_dp=self.cont("T_dp"), on_machine={}, on_machine_twice={}, tp_occurs={},
                        latency={}, bandwidth={}, running={}, tied=tied)
        if self.d == 1:  # no layer syncs; a tied model's two copies still do [M17]
            self.add(sync.t_dp >= (tied.bandwidth + tied.latency if tied else 0))
            return sync
        tau = {}
        for l in self.L:
            self._holders(l, layout.z, sync)
            lat = self._latency(l, sync)
            for kind in self.tb.sync_kinds(l):
                tau[kind, l] = self._bandwidth(kind, l, sync) + lat
        self._stage_sync(layout.beta, tau, sync)
        return sync

    def _latency(self, l: int, sync: SyncVars):
        """G(ℓ) ≥ dp_lat_part(M1, M2) when M1 and M2 both hold ℓ (M, M: for two pipelines)."""
        tb, d, u = self.tb, self.d, self.unit
        one, two = sync.on_machine, sync.on_machine_twice
        lat = sync.latency[l] = self.cont(f"G_{l}")
        for k1 in self.K:
            self.add(lat >= tb.dp_lat_part(d, k1, k1) / u * two[l, k1])
            for k2 in range(k1 + 1, tb.num_machines):
                self.add(lat >= tb.dp_lat_part(d, k1, k2) / u * (one[l, k1] + one[l, k2] - 1))
        return lat

    def _bandwidth(self, kind: str, l: int, sync: SyncVars):
        """F(ℓ) ≥ dp_bw_part(P, t, M1, M2) when TP size t occurs and M1, M2 both hold ℓ."""
        tb, d, u, params = self.tb, self.d, self.unit, self.tb.pseudo_params[kind]
        one, two = sync.on_machine, sync.on_machine_twice
        bw = sync.bandwidth[kind, l] = self.cont(f"F_{kind}_{l}")
        for t in tb.tp_values:
            g = sync.tp_occurs[l, t]
            for k1 in self.K:
                self.add(bw >= tb.dp_bw_part(d, params, t, k1, k1) / u * (g + two[l, k1] - 1))
                for k2 in range(k1 + 1, tb.num_machines):
                    self.add(bw >= tb.dp_bw_part(d, params, t, k1, k2) / u * (g + one[l, k1] + one[l, k2] - 2))
        return bw

    def _stage_sync(self, beta: dict, tau: dict, sync: SyncVars) -> None:
        """Running Σ τ_dp inside a stage; T_dp ≥ every stage's sum (+head). A tied model's sync
        instead at ℓ = 0 and, when the last stage is another stage (S_p ≥ 2), at L − 1 [M17]."""
        big_l, tied = self.tb.layers, sync.tied
        big = self.tb.sync_ceiling(self.d) / self.unit
        for p in self.P:
            for l in self.L:
                acc = sync.running[p, l] = self.cont(f"dacc_{p}_{l}")
                if l == 0:
                    self.add(acc >= tau["layer", 0] + (tied.bandwidth + tied.latency if tied else tau["emb", 0]))
                else:
                    self.add(acc >= tau["layer", l])
                    self.add(acc >= sync.running[p, l - 1] + tau["layer", l] - big * beta[p, l])
                self.add(sync.t_dp >= acc)
            if tied:
                self.add(sync.t_dp >= sync.running[p, big_l - 1] + tied.bandwidth + tied.latency
                         - big * (1 - tied.several[p]))
            else:
                self.add(sync.t_dp >= sync.running[p, big_l - 1] + tau["head", big_l - 1])

    def _holders(self, l: int, z: dict, sync: SyncVars) -> None:
        """Indicators for layer ℓ: machine M holds it (for ≥1 / ≥2 pipelines), TP t occurs."""
        tb, d = self.tb, self.d
        for k in self.K:
            one = sync.on_machine[l, k] = self.cont(f"h1_{l}_{k}", 0, 1)
            two = sync.on_machine_twice[l, k] = self.bin(f"h2_{l}_{k}")
            for p in self.P:
                self.add(one >= self.on_machine(z, p, l, k))
            self.add((d - 1) * two >= pulp.lpSum(self.on_machine(z, p, l, k) for p in self.P) - 1)
        for t in tb.tp_values:
            g = sync.tp_occurs[l, t] = self.cont(f"ht_{l}_{t}", 0, 1)
            for p in self.P:
                for c in self.C:
                    if tb.types[c].tp == t:
                        self.add(g >= z[p, l, c])
