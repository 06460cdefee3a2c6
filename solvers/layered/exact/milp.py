"""The MILP model (PuLP; HiGHS via highspy, CBC as fallback): docs/formulation.md §2.2.

Layer-indexed: for each pipeline p and layer ℓ, binaries z[p,ℓ,c] say which stage type
holds ℓ and β[p,ℓ] whether a new stage starts at ℓ. Every product is linearized exactly
(big-M with bounds from the tables, a binary expansion of m_p − 1). Times are continuous,
in units of the trivial lower bound (so values are O(1)); the labels [M1]…[M12] are the
constraint families of docs/formulation.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np
import pulp

from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions
from solvers.layered.exact.driver import SubProblem, SubResult, solve_exact, solver_time
from solvers.layered.exact.tables import PipelineSpec

GAP = 1e-9  # relative MIP gap: "optimal" means optimal to float tolerance


class MilpModel:
    """The model for one number of pipelines D."""

    def __init__(self, sub: SubProblem):
        self.sub, self.tb, self.d = sub, sub.tables, sub.pipelines
        self.unit = self.tb.trivial_bound
        self.lp = pulp.LpProblem(f"hexiscale_D{self.d}", pulp.LpMinimize)
        self.P, self.L, self.C = range(self.d), range(self.tb.layers), range(len(self.tb.types))
        self.K = range(self.tb.num_machines)
        self._count = 0

    def add(self, constraint) -> None:
        self._count += 1
        self.lp += constraint, f"c{self._count}"

    def bin(self, name: str):
        return self.lp.add_variable(name, cat="Binary")

    def cont(self, name: str, low=0.0, up=None):
        return self.lp.add_variable(name, lowBound=low, upBound=up)

    def build(self) -> None:
        self._layout()
        self._batches()
        self._memory()
        self._pipe_times()
        self._dp_sync()
        self.T = self.cont("T")
        for p in self.P:  # [M12] T ≥ T_pipe(p) + T_dp
            self.add(self.T >= self.bubble[p] + self.steady[p] + self.t_dp)
        self._capacity_cuts()
        # [M13] valid cuts: m_0 ≥ ⌈B/(b·D)⌉ (pipelines are ordered), and T_dp's floor
        m_low = -(-self.tb.total_micro // self.d)
        self.add(self.T >= self.bubble[0] + (m_low - 1) * self.R[0] + self.t_dp)
        self.add(self.t_dp >= self.tb.dp_floor(self.d) / self.unit)
        if self.sub.cutoff is not None:
            self.add(self.T <= self.sub.cutoff / self.unit * (1 + 1e-9))
        self._floor_cuts()
        self._structure()
        self.lp += self.T

    def _structure(self) -> None:
        """[M16] a fixed structure [B4]: pipeline p uses exactly its candidate's stage types
        (s = z ∧ β exactly, Σ_ℓ s[p,ℓ,c] = multiplicity of c) and m_p."""
        if self.sub.structure is None:
            return
        for p, cand in enumerate(self.sub.structure):
            self.add(self.m[p] == cand.micro_batches)
            for c in self.C:
                times = cand.shape.stages.count(c)
                if not times:
                    for l in self.L:
                        self.add(self.z[p, l, c] == 0)
                    continue
                for l in range(1, self.tb.layers):
                    self.add(self.start[p, l, c] <= self.z[p, l, c])
                    self.add(self.start[p, l, c] <= self.beta[p, l])
                self.add(pulp.lpSum(self.start[p, l, c] for l in self.L) == times)
            if cand.order is not None:
                self._stage_order(p, cand.order)

    def _stage_order(self, p: int, order: tuple[int, ...]) -> None:
        """[M16] layer ℓ is in stage k = Σ_{ℓ' ≤ ℓ} β (u[ℓ,k] one-hot), whose type is order[k]."""
        L, S = self.tb.layers, len(order)
        self.add(pulp.lpSum(self.beta[p, l] for l in range(1, L)) == S - 1)
        for l in self.L:
            u = [self.bin(f"u_{p}_{l}_{k}") for k in range(S)]
            self.add(pulp.lpSum(u) == 1)
            self.add(pulp.lpSum(k * v for k, v in enumerate(u)) == pulp.lpSum(self.beta[p, k] for k in range(1, l + 1)))
            for c in self.C:
                self.add(self.z[p, l, c] == pulp.lpSum(v for k, v in enumerate(u) if order[k] == c))

    def _floor_cuts(self) -> None:
        """[M15] valid cuts (docs/formulation.md §4): T ≥ the combinatorial bound of D [B2];
        per pipeline, x[p,a] picks an allocation a ≥ p's device use (floors only fall as a
        grows), mm[p,m] = [m_p = m], and T ≥ Σ_a pipe_floor[m,a]·x[p,a] when mm[p,m] = 1."""
        tb, u, floors = self.tb, self.unit, self.sub.floors
        loose = 1 - 1e-7  # float sums of the same terms may differ in the last digits
        self.add(self.T >= loose * self.sub.lower_bound / u)
        if floors is None:
            return
        top = tb.total_micro - self.d + 1
        table = loose * floors.table[1:top + 1] / u
        cap = 10.0 * max(1.0, float(table[np.isfinite(table)].max(initial=1.0)))
        table = np.where(np.isfinite(table), table, cap)  # no pipeline fits: any value is valid
        allocs = list(np.ndindex(*reversed(floors.radix)))  # machines reversed, as in the table
        for p in self.P:
            x = [self.bin(f"xa_{p}_{i}") for i in range(len(allocs))]
            mm = [self.bin(f"mm_{p}_{m}") for m in range(1, top + 1)]
            self.add(pulp.lpSum(x) == 1)
            self.add(pulp.lpSum(mm) == 1)
            self.add(pulp.lpSum((i + 1) * v for i, v in enumerate(mm)) == self.m[p])
            for k in self.K:
                use = pulp.lpSum(tb.types[c].tp * self.start[p, l, c] for l in self.L for c in self.C
                                 if tb.types[c].machine == k)
                self.add(pulp.lpSum(a[len(allocs[0]) - 1 - k] * v for a, v in zip(allocs, x) if a) >= use)
            for i in range(top):
                row = table[i]
                self.add(self.T >= pulp.lpSum(float(row[j]) * v for j, v in enumerate(x) if row[j] > 0)
                         - float(row.max()) * (1 - mm[i]))

    # -- [M1]–[M5] layout: types per layer, stage boundaries, devices --------------------
    def _layout(self) -> None:
        tb, L = self.tb, self.tb.layers
        self.z = {(p, l, c): self.bin(f"z_{p}_{l}_{c}") for p in self.P for l in self.L for c in self.C}
        self.beta = {(p, l): self.bin(f"b_{p}_{l}") for p in self.P for l in range(1, L)}
        for p in self.P:
            for l in self.L:  # [M1] one type per layer
                self.add(pulp.lpSum(self.z[p, l, c] for c in self.C) == 1)
            for l in range(1, L):  # [M2] the type changes only at a stage boundary
                for c in self.C:
                    self.add(self.z[p, l, c] - self.z[p, l - 1, c] <= self.beta[p, l])
                    self.add(self.z[p, l - 1, c] - self.z[p, l, c] <= self.beta[p, l])
            # [M5] stages per pipeline
            self.add(pulp.lpSum(self.beta[p, l] for l in range(1, L)) <= self.sub.max_stages - 1)
        self.start = {}
        for (p, l, c), zv in self.z.items():  # [M3] s = z ∧ β: a stage of type c starts at ℓ
            if l == 0:
                self.start[p, l, c] = zv
            else:
                s = self.cont(f"s_{p}_{l}_{c}", 0, 1)
                self.add(s >= zv + self.beta[p, l] - 1)
                self.start[p, l, c] = s
        for p in self.P:
            for l in range(1, self.tb.layers):  # a change of type starts a stage (tightens [M3])
                for c in self.C:
                    self.add(self.start[p, l, c] >= self.z[p, l, c] - self.z[p, l - 1, c])
        for m in self.K:  # [M4] devices per machine
            self.add(pulp.lpSum(tb.types[c].tp * self.start[p, l, c] for p in self.P for l in self.L
                                for c in self.C if tb.types[c].machine == m) <= tb.cluster.machines[m].count)

    def _capacity_cuts(self) -> None:
        """[M14] valid cuts the LP relaxation needs: (a) a type holds at most n_max layers per
        stage; (b) every device of machine M is busy m_p·τ_σ ≤ T, so Σ t_σ·m_p·τ_σ ≤ count_M·T,
        written with y[p,ℓ,c] = m_p·z[p,ℓ,c] (exact: y ≤ top·z, Σ_c y = m_p)."""
        tb, L, u = self.tb, self.tb.layers, self.unit
        top = tb.total_micro - self.d + 1
        busy = {k: [] for k in self.K}
        for p in self.P:
            for c in self.C:
                self.add(pulp.lpSum(self.z[p, l, c] for l in self.L)
                         <= int(tb.n_max[c, 0, 0, 1]) * pulp.lpSum(self.start[p, l, c] for l in self.L))
            for l in self.L:
                ys = {c: self.cont(f"y_{p}_{l}_{c}", 0, top) for c in self.C}
                self.add(pulp.lpSum(ys.values()) == self.m[p])
                for c, y in ys.items():
                    self.add(y <= top * self.z[p, l, c])
                    cost = tb.tau_layer[c] + (tb.tau_head[c] if l == L - 1 else 0.0)
                    busy[tb.types[c].machine].append(tb.types[c].tp * cost / u * y)
        for k in self.K:
            self.add(tb.cluster.machines[k].count * self.T >= pulp.lpSum(busy[k]))

    def zm(self, p: int, l: int, m: int):
        return pulp.lpSum(self.z[p, l, c] for c in self.C if self.tb.types[c].machine == m)

    # -- [M6] micro-batches, ordered pipelines [R2], binary expansion of m_p − 1 -----------
    def _batches(self) -> None:
        total, d = self.tb.total_micro, self.d
        top = total - d + 1
        self.m = {p: self.lp.add_variable(f"m_{p}", 1, top, cat="Integer") for p in self.P}
        self.add(pulp.lpSum(self.m.values()) == total)
        for p in range(d - 1):
            self.add(self.m[p] >= self.m[p + 1])
        self.bits = {}
        nbits = max(1, (top - 1).bit_length())
        for p in self.P:
            bits = [self.bin(f"mb_{p}_{k}") for k in range(nbits)]
            self.add(self.m[p] - 1 == pulp.lpSum((1 << k) * b for k, b in enumerate(bits)))
            self.bits[p] = bits

    # -- [M7] memory: cnt ≤ n_max(c, first, last, q) with q = min(S − k, m_p) -----------------
    def _memory(self) -> None:
        tb, L, Q = self.tb, self.tb.layers, self.tb.q_top
        top = tb.total_micro - self.d + 1
        for p in self.P:
            mge = {j: self.bin(f"mge_{p}_{j}") for j in range(2, Q + 1)}  # ≥ [m_p ≥ j]
            for j, v in mge.items():
                self.add(v * (top - j + 1) >= self.m[p] - j + 1)
            cnt_prev = f_prev = None
            for l in self.L:
                cnt, f = self.cont(f"cnt_{p}_{l}", 1, L), self.bin(f"f_{p}_{l}")
                if l == 0:
                    self.add(f == 1)
                else:  # position in the stage and "stage holds layer 0"
                    self.add(cnt >= cnt_prev + 1 - L * self.beta[p, l])
                    self.add(f >= f_prev - self.beta[p, l])
                after = pulp.lpSum(self.beta[p, k] for k in range(l + 1, L))  # r − 1
                s_top = self.sub.max_stages
                top_j = min(Q, s_top) if s_top < 2 else max(2, min(Q, s_top))
                rge = {j: self.bin(f"rge_{p}_{l}_{j}") for j in range(2, top_j + 1)}
                for j, v in rge.items():  # rge_j ≥ [r ≥ j]; rge_2 = [not last] exactly
                    self.add(v * (s_top - j + 1) >= after - j + 2)
                if 2 in rge:
                    self.add(rge[2] <= after)
                not_last = rge.get(2, 0)
                q_steps = {j: self.bin(f"q_{p}_{l}_{j}") for j in rge if j <= Q}
                for j, v in q_steps.items():  # q ≥ j iff r ≥ j and m ≥ j
                    self.add(v >= rge[j] + mge[j] - 1)
                self._memory_rows(p, l, cnt, f, not_last, q_steps)
                cnt_prev, f_prev = cnt, f

    def _memory_rows(self, p, l, cnt, f, not_last, q_steps) -> None:
        nm, big = self.tb.n_max, self.tb.layers
        for c in self.C:
            for first in (0, 1):
                off = big * (1 - self.z[p, l, c]) + big * ((1 - f) if first else f)
                n1 = int(nm[c, first, 0, 1])
                drops = pulp.lpSum(int(nm[c, first, 0, j - 1] - nm[c, first, 0, j]) * v
                                   for j, v in q_steps.items())
                self.add(cnt <= n1 - drops + off + big * (1 - not_last))
                self.add(cnt <= int(nm[c, first, 1, 1]) + off + big * not_last)

    # -- [M8]–[M10] stage times, pipeline traffic, 1F1B ------------------------------------
    def _pipe_times(self) -> None:
        tb, L, u = self.tb, self.tb.layers, self.unit
        t1 = [tb.tau_layer[c] / u for c in self.C]
        th = [tb.tau_head[c] / u for c in self.C]
        big_tau = max(L * a + b for a, b in zip(t1, th))
        big_pp = float(tb.pp_link.max() + max(tb.pp_bcast.max(), 0.0)) / u
        r_top = max(big_tau, big_pp)
        self.bubble, self.steady, self.R = {}, {}, {}
        for p in self.P:
            R = self.R[p] = self.cont(f"R_{p}", 0, r_top)
            work = {l: pulp.lpSum(t1[c] * self.z[p, l, c] for c in self.C) for l in self.L}
            acc_prev = None
            for l in self.L:  # [M8] running τ inside a stage; R ≥ every stage's τ
                acc = self.cont(f"acc_{p}_{l}", 0, big_tau)
                self.add(acc >= work[l])
                if l:
                    self.add(acc >= acc_prev + work[l] - big_tau * self.beta[p, l])
                self.add(R >= acc)
                acc_prev = acc
            head = pulp.lpSum(th[c] * self.z[p, L - 1, c] for c in self.C)
            self.add(R >= acc_prev + head)
            for k in self.K:  # [M8'] machine balance: Σ_σ on M t_σ·τ_σ ≤ count_M·R_p (a valid cut)
                on_k = [c for c in self.C if tb.types[c].machine == k]
                self.add(tb.cluster.machines[k].count * R >= pulp.lpSum(
                    tb.types[c].tp * (t1[c] * pulp.lpSum(self.z[p, l, c] for l in self.L)
                                      + th[c] * self.z[p, L - 1, c]) for c in on_k))
            pp_total = []
            for l in range(1, L):  # [M9] T_pp at a boundary = link part + broadcast part
                a, b = self.cont(f"ppl_{p}_{l}"), self.cont(f"ppb_{p}_{l}")
                for m1 in self.K:
                    for m2 in self.K:
                        self.add(a >= tb.pp_link[m1, m2] / u
                                 * (self.zm(p, l - 1, m1) + self.zm(p, l, m2) + self.beta[p, l] - 2))
                for c in self.C:
                    if tb.pp_bcast[c] > 0:
                        self.add(b >= tb.pp_bcast[c] / u * (self.z[p, l, c] + self.beta[p, l] - 1))
                self.add(R >= a + b)
                pp_total += [a, b]
            steady = []
            for k, bit in enumerate(self.bits[p]):  # [M10] (m_p − 1)·R = Σ 2^k·bit_k·R
                w = self.cont(f"w_{p}_{k}", 0, r_top)
                self.add(w >= R - r_top * (1 - bit))
                steady.append((1 << k) * w)
            self.bubble[p] = pulp.lpSum(work.values()) + head + pulp.lpSum(pp_total)
            self.steady[p] = pulp.lpSum(steady)

    # -- [M11] data-parallel sync: τ_dp(ℓ) = F(t_min, bw_min) + G(α_max) ------------------
    def _dp_sync(self) -> None:
        tb, L, d, u = self.tb, self.tb.layers, self.d, self.unit
        self.t_dp = self.cont("T_dp")
        if d == 1:
            self.add(self.t_dp == 0)
            return
        params = tb.pseudo_params
        tau = {}
        for l in self.L:
            act_m, act_2m, act_t = self._holders(l)
            kinds = ["layer"] + (["emb"] if l == 0 else []) + (["head"] if l == L - 1 else [])
            lat = self.cont(f"G_{l}")
            for m1 in self.K:
                self.add(lat >= tb.dp_lat_part(d, m1, m1) / u * act_2m[m1])
                for m2 in range(m1 + 1, tb.num_machines):
                    self.add(lat >= tb.dp_lat_part(d, m1, m2) / u * (act_m[m1] + act_m[m2] - 1))
            for kind in kinds:
                bw = self.cont(f"F_{kind}_{l}")
                for t, g in act_t.items():
                    for m1 in self.K:
                        self.add(bw >= tb.dp_bw_part(d, params[kind], t, m1, m1) / u * (g + act_2m[m1] - 1))
                        for m2 in range(m1 + 1, tb.num_machines):
                            self.add(bw >= tb.dp_bw_part(d, params[kind], t, m1, m2) / u
                                     * (g + act_m[m1] + act_m[m2] - 2))
                tau[kind, l] = bw + lat
        big = (L + 2) * max(tb.dp_bw_part(d, params["emb"], 1, m1, m2) + tb.dp_lat_part(d, m1, m2)
                            for m1 in self.K for m2 in self.K) / u
        for p in self.P:  # running Σ τ_dp inside a stage; T_dp ≥ every stage's sum
            acc_prev = None
            for l in self.L:
                acc = self.cont(f"dacc_{p}_{l}")
                if l == 0:
                    self.add(acc >= tau["layer", 0] + tau["emb", 0])
                else:
                    self.add(acc >= tau["layer", l])
                    self.add(acc >= acc_prev + tau["layer", l] - big * self.beta[p, l])
                self.add(self.t_dp >= acc)
                acc_prev = acc
            self.add(self.t_dp >= acc_prev + tau["head", L - 1])

    def _holders(self, l: int):
        """Indicators for layer ℓ: machine m holds it (for ≥1 / ≥2 pipelines), TP t occurs."""
        tb, d = self.tb, self.d
        act_m, act_2m, act_t = {}, {}, {}
        for m in self.K:
            one, two = self.cont(f"h1_{l}_{m}", 0, 1), self.bin(f"h2_{l}_{m}")
            for p in self.P:
                self.add(one >= self.zm(p, l, m))
            self.add((d - 1) * two >= pulp.lpSum(self.zm(p, l, m) for p in self.P) - 1)
            act_m[m], act_2m[m] = one, two
        for t in tb.tp_values:
            g = self.cont(f"ht_{l}_{t}", 0, 1)
            for p in self.P:
                for c in self.C:
                    if tb.types[c].tp == t:
                        self.add(g >= self.z[p, l, c])
            act_t[t] = g
        return act_m, act_2m, act_t

    # -- reading the solution back --------------------------------------------------------
    def specs(self) -> list[PipelineSpec]:
        out = []
        for p in self.P:
            stages = []
            for l in self.L:
                c = max(self.C, key=lambda c: self.z[p, l, c].value() or 0.0)
                new = l == 0 or (self.beta[p, l].value() or 0.0) > 0.5
                if new:
                    stages.append([self.tb.types[c], 1])
                else:
                    stages[-1][1] += 1
            out.append(PipelineSpec(stages=tuple((c, n) for c, n in stages),
                                    micro_batches=int(round(self.m[p].value()))))
        return out


def _solver(sub: SubProblem, time_limit: float):
    opts = sub.options
    if pulp.HiGHS().available():
        return pulp.HiGHS(msg=opts.verbose, timeLimit=time_limit, threads=opts.threads,
                          gapRel=GAP, gapAbs=1e-9, random_seed=opts.seed,
                          mip_feasibility_tolerance=1e-9, primal_feasibility_tolerance=1e-9)
    return pulp.PULP_CBC_CMD(msg=opts.verbose, timeLimit=time_limit, threads=opts.threads,
                             gapRel=GAP, options=[f"randomSeed {opts.seed}"])


def solve_fixed_d(sub: SubProblem) -> SubResult:
    start = time.perf_counter()
    model = MilpModel(sub)
    model.build()
    size = dict(variables=len(model.lp.variables()), constraints=model.lp.numConstraints())
    size["build_s"] = time.perf_counter() - start
    solver = _solver(sub, solver_time(sub, start))
    with _quiet_stdout(not sub.options.verbose):
        model.lp.solve(solver)
    status, has_solution, unit_bound = _read_status(model.lp, solver)
    bound = None if unit_bound is None else max(0.0, unit_bound) * model.unit
    if not has_solution:
        return SubResult(status=status, bound=bound, **size)
    return SubResult(status=status, specs=model.specs(), objective=model.T.value() * model.unit,
                     bound=bound, **size)


@contextlib.contextmanager
def _quiet_stdout(quiet: bool):
    """HiGHS prints its banner from C++ straight to file descriptor 1, whatever msg says;
    it would corrupt `hexiscale solve --json`."""
    if not quiet:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _read_status(lp: pulp.LpProblem, solver) -> tuple[str, bool, float | None]:
    """(status, has a solution, lower bound in model units) from HiGHS or CBC."""
    highs = getattr(lp, "solverModel", None)
    if isinstance(solver, pulp.HiGHS) and highs is not None:
        import highspy

        info, ms = highs.getInfo(), highs.getModelStatus()
        if ms == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", False, None
        has = info.primal_solution_status == 2  # kSolutionStatusFeasible
        dual = info.mip_dual_bound
        bound = dual if abs(dual) < 1e30 else None
        optimal = ms == highspy.HighsModelStatus.kOptimal
        return ("optimal" if optimal else "feasible" if has else "unknown"), has, bound
    if lp.status == pulp.LpStatusInfeasible:
        return "infeasible", False, None
    has = lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    optimal = lp.sol_status == pulp.LpSolutionOptimal
    bound = pulp.value(lp.objective) if optimal else None
    return ("optimal" if optimal else "feasible" if has else "unknown"), has, bound


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """Exact MILP solve: the optimum of DESIGN.md §3 over the plan space of §2, with a bound."""
    return solve_exact(problem, options or SolverOptions(), "milp", solve_fixed_d)
