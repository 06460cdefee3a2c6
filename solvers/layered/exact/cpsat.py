"""The CP-SAT model (OR-Tools): docs/formulation.md §2.1.

Layer-indexed like the MILP, but written with CP-SAT's own constraints: enforcement
literals instead of big-M, element constraints for table look-ups (pipeline traffic,
memory), exact integer products for the 1F1B term and min/max equalities, so that every
intermediate variable equals its DESIGN.md value. Times are integers in a unit chosen so
that rounding every coefficient down keeps the model's T within a reported bound below the
true T (docs/formulation.md §2.1, "time units"). Labels [C1]…[C12] cite the constraint families.
"""

from __future__ import annotations

import math
import time

from ortools.sat.python import cp_model

from planner.problem import Problem
from solvers.common import SolveResult, SolverOptions
from solvers.layered.exact.driver import SubProblem, SubResult, solve_exact, solver_time
from solvers.layered.exact.tables import PipelineSpec

FINEST_ROUNDING = 1e-8  # rounding error of T relative to the trivial lower bound, at best
# CP-SAT misjudged optimality (claimed a worse plan optimal) when T's domain reached 2^33 units
# (fine at 2^30) and searches slowly on huge domains: the unit is coarsened until T's domain,
# [0, incumbent] when there is one, is below 2^26
LARGEST_T_UNITS = 2**26


class CpSatModel:
    """The model for one number of pipelines D."""

    def __init__(self, sub: SubProblem):
        self.sub, self.tb, self.d = sub, sub.tables, sub.pipelines
        tb = self.tb
        self.P, self.L, self.C = range(self.d), range(tb.layers), range(len(tb.types))
        self.nk = tb.num_machines
        self.error_units = self._error_units()
        self.unit = FINEST_ROUNDING * tb.trivial_bound / self.error_units
        self._upper_bounds()
        top = self.t_top if sub.cutoff is None else min(self.t_top, sub.cutoff / self.unit + 1)
        if top > LARGEST_T_UNITS:
            self.unit *= top / LARGEST_T_UNITS
            self._upper_bounds()
        if sub.cutoff is not None:  # every part of T is at most T ≤ cutoff: tighter domains
            clip = math.ceil(sub.cutoff / self.unit) + 1
            self.r_top, self.bubble_top = min(self.r_top, clip), min(self.bubble_top, clip)
            self.steady_top, self.dp_top = min(self.steady_top, clip), min(self.dp_top, clip)
            self.t_top = min(self.t_top, clip)
        self.m = cp_model.CpModel()

    def _error_units(self) -> int:
        """How many floored coefficients one plan's T adds up (each loses < 1 unit)."""
        tb, big_l = self.tb, self.tb.layers
        steady = (tb.total_micro - self.d) * (big_l + 1)
        return (big_l + 1) + 2 * (self.sub.max_stages - 1) + steady + 2 * (big_l + 2)

    def units(self, seconds: float) -> int:
        return int(math.floor(seconds / self.unit))

    def build(self) -> None:
        self._upper_bounds()
        self._layout()
        self._batches()
        self._memory()
        self._pipe_times()
        self._dp_sync()
        pipe_max = self.m.NewIntVar(0, self.t_top, "pipe_max")
        self.m.AddMaxEquality(pipe_max, [self.pipe[p] for p in self.P])  # [C12]
        self.T = self.m.NewIntVar(0, self.t_top, "T")
        self.m.Add(self.T == pipe_max + self.t_dp)
        # [C13] valid cuts: m_0 ≥ ⌈B/(b·D)⌉ (pipelines are ordered), and T_dp's floor
        m_low = -(-self.tb.total_micro // self.d)
        self.m.Add(pipe_max >= self.bubble[0] + (m_low - 1) * self.R[0])
        self.m.Add(self.t_dp >= self.units(self.tb.dp_floor(self.d)))
        if self.sub.cutoff is not None:
            self.m.Add(self.T <= math.ceil(self.sub.cutoff / self.unit))
        self._floor_cuts()
        self._structure()
        self.m.Minimize(self.T)

    def _structure(self) -> None:
        """[C15] a fixed structure [B4]: pipeline p uses exactly its candidate's stage types
        (start = z ∧ β exactly, Σ_ℓ start[p,ℓ,c] = multiplicity of c) and m_p."""
        if self.sub.structure is None:
            return
        for p, cand in enumerate(self.sub.structure):
            self.m.Add(self.mb[p] == cand.micro_batches)
            for c in self.C:
                times = cand.shape.stages.count(c)
                if not times:
                    for l in self.L:
                        self.m.Add(self.z[p, l, c] == 0)
                    continue
                for l in range(1, self.tb.layers):
                    self.m.AddImplication(self.start[p, l, c], self.z[p, l, c])
                    self.m.AddImplication(self.start[p, l, c], self.beta[p, l])
                self.m.Add(sum(self.start[p, l, c] for l in self.L) == times)
            if cand.order is not None:  # [C15] layer ℓ is in stage r = Σ_{ℓ' ≤ ℓ} β, of type order[r]
                order = list(cand.order)
                self.m.Add(sum(self.beta[p, l] for l in range(1, self.tb.layers)) == len(order) - 1)
                for l in self.L:
                    r = self._expr_var(sum(self.beta[p, k] for k in range(1, l + 1)), len(order) - 1, f"r_{p}_{l}")
                    self.m.AddElement(r, order, self.ci[p, l])

    def _floor_cuts(self) -> None:
        """[C14] valid cuts (docs/formulation.md §4): T ≥ the combinatorial bound of D [B2],
        and T ≥ pipe_floor[m_p, a_p] for each pipeline, a_p its devices per machine [B1]/[B3]."""
        # the model's T of a plan is its floored coefficients added up, up to error_units below
        # floor(true T / unit): a cut at a true bound must give way by as much
        slack = self.error_units
        self.m.Add(self.T >= max(0, self.units(self.sub.lower_bound) - slack))
        floors = self.sub.floors
        if floors is None:
            return
        table = floors.table
        flat = [max(0, self.units(x) - slack) if math.isfinite(x) else self.t_top + 1 for x in table.ravel()]
        for p in self.P:
            alloc = sum(floors.strides[k] * self.device_use[p, k] for k in range(self.nk))
            idx = self._expr_var(self.mb[p] * floors.num_allocations + alloc, len(flat) - 1, f"fx_{p}")
            value = self.m.NewIntVar(0, max(flat), f"floor_{p}")
            self.m.AddElement(idx, flat, value)
            self.m.Add(self.T >= value)

    def _upper_bounds(self) -> None:
        tb, big_l = self.tb, self.tb.layers
        self.t1 = [self.units(x) for x in tb.tau_layer]
        self.th = [self.units(x) for x in tb.tau_head]
        self.link = [self.units(tb.pp_link[a, b]) for a in range(self.nk) for b in range(self.nk)]
        self.bcast = [self.units(x) for x in tb.pp_bcast]
        tau_top = max(big_l * a + b for a, b in zip(self.t1, self.th))
        pp_top = max(self.link) + max(self.bcast)
        self.r_top = max(tau_top, pp_top)
        self.bubble_top = tau_top + (big_l - 1) * pp_top
        self.steady_top = (tb.total_micro - self.d) * self.r_top
        dp = [self._dp_tables(kind) for kind in ("layer", "emb", "head")]
        self.dp_top = (big_l + 2) * (max(max(t) for t in dp) + max(self._lat_table()))
        self.t_top = self.bubble_top + self.steady_top + self.dp_top

    # -- [C1]–[C5] layout ----------------------------------------------------------------
    def _layout(self) -> None:
        m, tb, big_l = self.m, self.tb, self.tb.layers
        tp_index = {t: i for i, t in enumerate(tb.tp_values)}
        self.z, self.beta, self.ci, self.mi, self.ti = {}, {}, {}, {}, {}
        for p in self.P:
            for l in self.L:
                zs = [m.NewBoolVar(f"z_{p}_{l}_{c}") for c in self.C]
                m.AddExactlyOne(zs)  # [C1]
                for c in self.C:
                    self.z[p, l, c] = zs[c]
                self.ci[p, l] = self._expr_var(sum(c * zs[c] for c in self.C), len(tb.types) - 1, f"ci_{p}_{l}")
                self.mi[p, l] = self._expr_var(sum(tb.types[c].machine * zs[c] for c in self.C),
                                               self.nk - 1, f"mi_{p}_{l}")
                self.ti[p, l] = self._expr_var(sum(tp_index[tb.types[c].tp] * zs[c] for c in self.C),
                                               len(tp_index) - 1, f"ti_{p}_{l}")
                if l:
                    self.beta[p, l] = m.NewBoolVar(f"b_{p}_{l}")
                    m.Add(self.ci[p, l] == self.ci[p, l - 1]).OnlyEnforceIf(self.beta[p, l].Not())  # [C2]
            m.Add(sum(self.beta[p, l] for l in range(1, big_l)) <= self.sub.max_stages - 1)  # [C5]
        use = {(p, k): [] for p in self.P for k in range(self.nk)}
        self.start = {}
        for (p, l, c), zv in self.z.items():  # [C3] a stage of type c starts at ℓ
            if l == 0:
                start = zv
            else:
                start = m.NewBoolVar(f"s_{p}_{l}_{c}")
                m.AddBoolOr([zv.Not(), self.beta[p, l].Not(), start])
            self.start[p, l, c] = start
            use[p, tb.types[c].machine].append(tb.types[c].tp * start)
        self.device_use = {}  # a[p, M]: devices of machine M in pipeline p's stages
        for (p, k), terms in use.items():
            self.device_use[p, k] = self._expr_var(sum(terms), tb.cluster.machines[k].count, f"a_{p}_{k}")
        for k in range(self.nk):  # [C4]
            m.Add(sum(self.device_use[p, k] for p in self.P) <= tb.cluster.machines[k].count)

    def _expr_var(self, expr, top: int, name: str):
        v = self.m.NewIntVar(0, top, name)
        self.m.Add(v == expr)
        return v

    # -- [C6] micro-batches, ordered pipelines [R2] ----------------------------------------
    def _batches(self) -> None:
        total = self.tb.total_micro
        top = total - self.d + 1
        self.mb = {p: self.m.NewIntVar(1, top, f"m_{p}") for p in self.P}
        self.m.Add(sum(self.mb.values()) == total)
        for p in range(self.d - 1):
            self.m.Add(self.mb[p] >= self.mb[p + 1])

    # -- [C7] memory: n ≤ n_max[c, first, last, q], q = min(S − k, m_p) --------------------
    def _memory(self) -> None:
        m, tb, big_l = self.m, self.tb, self.tb.layers
        q_top = tb.q_top
        flat = [int(tb.n_max[c, f, last, q]) for c in self.C for f in (0, 1) for last in (0, 1)
                for q in range(q_top + 1)]
        for p in self.P:
            cnt_prev = f_prev = None
            for l in self.L:
                cnt, f = m.NewIntVar(1, big_l, f"cnt_{p}_{l}"), m.NewBoolVar(f"f_{p}_{l}")
                if l == 0:
                    m.Add(cnt == 1)
                    m.Add(f == 1)
                else:
                    new = self.beta[p, l]
                    m.Add(cnt == cnt_prev + 1).OnlyEnforceIf(new.Not())
                    m.Add(cnt == 1).OnlyEnforceIf(new)
                    m.Add(f == f_prev).OnlyEnforceIf(new.Not())
                    m.Add(f == 0).OnlyEnforceIf(new)
                r = self._expr_var(1 + sum(self.beta[p, k] for k in range(l + 1, big_l)),
                                   self.sub.max_stages, f"r_{p}_{l}")
                last = m.NewBoolVar(f"last_{p}_{l}")
                m.Add(r == 1).OnlyEnforceIf(last)
                m.Add(r >= 2).OnlyEnforceIf(last.Not())
                q = m.NewIntVar(1, q_top, f"q_{p}_{l}")
                m.AddMinEquality(q, [r, self.mb[p]])
                idx = self._expr_var(((self.ci[p, l] * 2 + f) * 2 + last) * (q_top + 1) + q,
                                     len(flat) - 1, f"mi_{p}_{l}")
                cap = m.NewIntVar(0, big_l, f"nmax_{p}_{l}")
                m.AddElement(idx, flat, cap)
                m.Add(cnt <= cap)
                cnt_prev, f_prev = cnt, f

    # -- [C8]–[C10] stage times, pipeline traffic, 1F1B --------------------------------------
    def _pipe_times(self) -> None:
        m, big_l = self.m, self.tb.layers
        self.pipe, self.bubble, self.R = {}, {}, {}
        for p in self.P:
            work = [sum(self.t1[c] * self.z[p, l, c] for c in self.C) for l in self.L]
            parts, pps = [], []
            acc_prev = None
            for l in self.L:  # [C8] τ accumulates inside a stage
                acc = m.NewIntVar(0, self.r_top, f"acc_{p}_{l}")
                if l == 0:
                    m.Add(acc == work[0])
                else:
                    m.Add(acc == acc_prev + work[l]).OnlyEnforceIf(self.beta[p, l].Not())
                    m.Add(acc == work[l]).OnlyEnforceIf(self.beta[p, l])
                parts.append(acc)
                acc_prev = acc
            head = sum(self.th[c] * self.z[p, big_l - 1, c] for c in self.C)
            with_head = self._expr_var(acc_prev + head, self.r_top, f"acch_{p}")
            parts[-1] = with_head
            for l in range(1, big_l):  # [C9] T_pp = link(M, M') + broadcast(c') at a boundary
                pair = self._expr_var(self.mi[p, l - 1] * self.nk + self.mi[p, l], self.nk ** 2 - 1, f"pr_{p}_{l}")
                link = m.NewIntVar(0, max(self.link), f"lk_{p}_{l}")
                m.AddElement(pair, self.link, link)
                bc = m.NewIntVar(0, max(self.bcast), f"bc_{p}_{l}")
                m.AddElement(self.ci[p, l], self.bcast, bc)
                pp = m.NewIntVar(0, self.r_top, f"pp_{p}_{l}")
                m.Add(pp == link + bc).OnlyEnforceIf(self.beta[p, l])
                m.Add(pp == 0).OnlyEnforceIf(self.beta[p, l].Not())
                parts.append(pp)
                pps.append(pp)
            R = self.R[p] = m.NewIntVar(0, self.r_top, f"R_{p}")
            m.AddMaxEquality(R, parts)
            for k in range(self.nk):  # [C8'] machine balance: Σ_σ on M t_σ·τ_σ ≤ count_M·R_p
                on_k = [c for c in self.C if self.tb.types[c].machine == k]
                m.Add(self.tb.cluster.machines[k].count * R >= sum(
                    self.tb.types[c].tp * (self.t1[c] * sum(self.z[p, l, c] for l in self.L)
                                           + self.th[c] * self.z[p, big_l - 1, c]) for c in on_k))
            m1 = m.NewIntVar(0, self.tb.total_micro - self.d, f"m1_{p}")
            m.Add(m1 == self.mb[p] - 1)
            steady = m.NewIntVar(0, self.steady_top, f"steady_{p}")
            m.AddMultiplicationEquality(steady, [m1, R])  # [C10] (m_p − 1)·max_k max(τ_k, T_pp,k)
            self.bubble[p] = sum(work) + head + sum(pps)
            self.pipe[p] = self._expr_var(self.bubble[p] + steady, self.bubble_top + self.steady_top, f"pipe_{p}")

    # -- [C11] data-parallel sync over pairs of pipelines ---------------------------------------
    def _dp_tables(self, kind: str) -> list[int]:
        """[(M1·K + M2)·|T| + index of t_min] → bandwidth part of τ_dp, in units."""
        tb = self.tb
        p = tb.pseudo_params[kind]
        return [self.units(tb.dp_bw_part(self.d, p, t, a, b)) if self.d > 1 else 0
                for a in range(self.nk) for b in range(self.nk) for t in tb.tp_values]

    def _lat_table(self) -> list[int]:
        return [self.units(self.tb.dp_lat_part(self.d, a, b)) if self.d > 1 else 0
                for a in range(self.nk) for b in range(self.nk)]

    def _dp_sync(self) -> None:
        m, tb, big_l = self.m, self.tb, self.tb.layers
        self.t_dp = m.NewIntVar(0, self.dp_top, "T_dp")
        if self.d == 1:
            m.Add(self.t_dp == 0)
            return
        nt = len(tb.tp_values)
        tables = {kind: self._dp_tables(kind) for kind in ("layer", "emb", "head")}
        lat_table = self._lat_table()
        tau = {}
        for l in self.L:
            t_min = m.NewIntVar(0, nt - 1, f"tmin_{l}")
            m.AddMinEquality(t_min, [self.ti[p, l] for p in self.P])
            kinds = ["layer"] + (["emb"] if l == 0 else []) + (["head"] if l == big_l - 1 else [])
            bw_parts, lat_parts = {k: [] for k in kinds}, []
            for p in self.P:
                for p2 in range(p + 1, self.d):  # every pair of holders in different pipelines
                    pair = self._expr_var(self.mi[p, l] * self.nk + self.mi[p2, l], self.nk ** 2 - 1,
                                          f"dp_{l}_{p}_{p2}")
                    lat = m.NewIntVar(0, max(lat_table), f"dl_{l}_{p}_{p2}")
                    m.AddElement(pair, lat_table, lat)
                    lat_parts.append(lat)
                    idx = self._expr_var(pair * nt + t_min, self.nk ** 2 * nt - 1, f"dx_{l}_{p}_{p2}")
                    for kind in kinds:
                        v = m.NewIntVar(0, max(tables[kind]), f"dw_{kind}_{l}_{p}_{p2}")
                        m.AddElement(idx, tables[kind], v)
                        bw_parts[kind].append(v)
            g = m.NewIntVar(0, max(lat_table), f"G_{l}")
            m.AddMaxEquality(g, lat_parts)
            for kind in kinds:
                f = m.NewIntVar(0, max(tables[kind]), f"F_{kind}_{l}")
                m.AddMaxEquality(f, bw_parts[kind])
                tau[kind, l] = f + g
        ends = []
        for p in self.P:  # Σ τ_dp over each stage's layers, running
            acc_prev = None
            for l in self.L:
                acc = m.NewIntVar(0, self.dp_top, f"dacc_{p}_{l}")
                if l == 0:
                    m.Add(acc == tau["layer", 0] + tau["emb", 0])
                else:
                    m.Add(acc == acc_prev + tau["layer", l]).OnlyEnforceIf(self.beta[p, l].Not())
                    m.Add(acc == tau["layer", l]).OnlyEnforceIf(self.beta[p, l])
                ends.append(acc)
                acc_prev = acc
            ends[-1] = self._expr_var(acc_prev + tau["head", big_l - 1], self.dp_top, f"dacch_{p}")
        m.AddMaxEquality(self.t_dp, ends)

    # -- hint and solution --------------------------------------------------------------------
    def add_hint(self, specs: list[PipelineSpec]) -> None:
        tb = self.tb
        for p, spec in enumerate(sorted(specs, key=lambda s: -s.micro_batches)):
            self.m.AddHint(self.mb[p], spec.micro_batches)
            l = 0
            for k, (c, n) in enumerate(spec.stages):
                for j in range(n):
                    for ci in self.C:
                        self.m.AddHint(self.z[p, l, ci], int(tb.types[ci] == c))
                    if l:
                        self.m.AddHint(self.beta[p, l], int(j == 0))
                    l += 1

    def specs(self, solver: cp_model.CpSolver) -> list[PipelineSpec]:
        out = []
        for p in self.P:
            stages = []
            for l in self.L:
                c = next(c for c in self.C if solver.Value(self.z[p, l, c]))
                if l == 0 or solver.Value(self.beta[p, l]):
                    stages.append([self.tb.types[c], 1])
                else:
                    stages[-1][1] += 1
            out.append(PipelineSpec(stages=tuple((c, n) for c, n in stages),
                                    micro_batches=solver.Value(self.mb[p])))
        return out


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, unit: float, d: int, log):
        super().__init__()
        self.unit, self.d, self.log = unit, d, log

    def on_solution_callback(self) -> None:
        self.log(f"D={self.d}: solution T ≤ {self.ObjectiveValue() * self.unit:.6g} s "
                 f"(bound {self.BestObjectiveBound() * self.unit:.6g} s)")


STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
          cp_model.INFEASIBLE: "infeasible", cp_model.UNKNOWN: "unknown"}


def solve_fixed_d(sub: SubProblem) -> SubResult:
    start = time.perf_counter()
    model = CpSatModel(sub)
    model.build()
    if sub.hint:
        model.add_hint(sub.hint)
    proto = model.m.Proto()
    size = dict(variables=len(proto.variables), constraints=len(proto.constraints))
    size["build_s"] = time.perf_counter() - start
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = solver_time(sub, start)
    solver.parameters.num_workers = sub.options.threads
    solver.parameters.random_seed = sub.options.seed
    solver.parameters.log_search_progress = sub.options.verbose
    code = solver.Solve(model.m, _Progress(model.unit, sub.pipelines, sub.log))
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT model invalid: {model.m.Validate()}")
    status = STATUS[code]
    error = model.error_units * model.unit
    bound = solver.BestObjectiveBound() * model.unit if status in ("optimal", "feasible", "unknown") else None
    if status not in ("optimal", "feasible"):
        return SubResult(status=status, bound=bound if status == "unknown" else None,
                         error_bound=error, **size)
    return SubResult(status=status, specs=model.specs(solver), objective=solver.ObjectiveValue() * model.unit,
                     bound=bound, error_bound=error, **size)


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """Exact CP-SAT solve: the optimum of DESIGN.md §3 over the plan space of §2, with a bound."""
    return solve_exact(problem, options or SolverOptions(), "cpsat", solve_fixed_d)
