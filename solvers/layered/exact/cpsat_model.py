"""The CP-SAT model's variables and constraint families [C1]–[C16] (docs/formulation.md §2.1):
`CpSatBuilder` adds one family at a time to one model (one D); `cpsat` builds and solves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from solvers.layered.exact.cpsat_tied import TiedVars, tied_at_last, tied_sync
from solvers.layered.exact.cpsat_units import TimeScale
from solvers.layered.exact.subproblem import SubProblem
from solvers.layered.exact.spec import in_flight_rule


# -- the variables, one frozen group per family ---------------------------------------------
@dataclass(frozen=True)
class LayoutVars:
    """[C1]–[C5]: which stage type holds each layer, where stages start, devices used."""

    z: dict  # (p, ℓ, c) → bool: type c holds layer ℓ of pipeline p [C1]
    beta: dict  # (p, ℓ ≥ 1) → bool: a stage starts at ℓ [C2]
    start: dict  # (p, ℓ, c) → bool: a stage of type c starts at ℓ [C3]
    type_index: dict  # (p, ℓ) → ci: the index of ℓ's stage type [C1]
    machine_index: dict  # (p, ℓ) → mi: the machine of ℓ's stage [C1]
    tp_index: dict  # (p, ℓ) → ti: the index of ℓ's TP size in tp_values [C1]
    device_use: dict  # (p, M) → a[p, M]: devices of machine M in pipeline p [C4]


@dataclass(frozen=True)
class MemoryVars:
    """[C7]: each layer's position in its stage and the memory cap of its stage."""

    position: dict  # (p, ℓ) → cnt: layers of ℓ's stage up to ℓ
    first: dict  # (p, ℓ) → f: ℓ's stage holds layer 0
    stages_left: dict  # (p, ℓ) → r = S − k of ℓ's stage
    last: dict  # (p, ℓ) → r = 1
    in_flight: dict  # (p, ℓ) → q (§3.5: 1F1B min(r, m_p), GPipe m_p)
    cap: dict  # (p, ℓ) → n_max[ci, f, last, q]


@dataclass(frozen=True)
class TimeVars:
    """[C8]–[C10]: stage times, pipeline traffic, the 1F1B steady state, T_pipe."""

    running: dict  # (p, ℓ) → τ of ℓ's stage up to ℓ [C8]; (p, "head") with the head
    traffic: dict  # (p, ℓ ≥ 1) → T_pp into the stage starting at ℓ, else 0 [C9]
    slowest: dict  # p → R_p = max_k max(τ_k, T_pp,k) [C10]
    steady: dict  # p → (m_p − 1)·R_p [C10]
    pipe: dict  # p → T_pipe(p) [C12]
    bubble: dict  # p → Σ τ + Σ T_pp (an expression) [C12]


@dataclass(frozen=True)
class SyncVars:
    """[C11]: τ_dp(ℓ) = F(ℓ) + G(ℓ) and T_dp (all empty but t_dp when D = 1); [C16] the tied sync."""

    t_dp: cp_model.IntVar
    t_min: dict  # ℓ → index of the smallest TP size among ℓ's holders
    bandwidth: dict  # (kind, ℓ) → F: bandwidth part of τ_dp
    latency: dict  # ℓ → G: latency part of τ_dp
    running: dict  # (p, ℓ) → Σ τ_dp over ℓ's stage up to ℓ; (p, "head") with the head
    tied: TiedVars | None  # a tied model's sync [C16], else None


class CpSatBuilder:
    """Adds one family of variables and constraints at a time to one model (one D)."""

    def __init__(self, sub: SubProblem, scale: TimeScale):
        self.sub, self.tb, self.d, self.scale = sub, sub.tables, sub.pipelines, scale
        self.P, self.L, self.C = sub.pipeline_range, range(self.tb.layers), range(len(self.tb.types))
        self.nk = self.tb.num_machines
        self.model = cp_model.CpModel()

    def int_var(self, expr, top: int, name: str) -> cp_model.IntVar:
        """A variable in [0, top] equal to a linear expression."""
        v = self.model.new_int_var(0, top, name)
        self.model.add(v == expr)
        return v

    # -- [C1]–[C5] layout ------------------------------------------------------------------
    def layout(self) -> LayoutVars:
        model, tb = self.model, self.tb
        z, beta, ci, mi, ti = {}, {}, {}, {}, {}
        for p in self.P:
            for l in self.L:
                self._layer_type(p, l, z, (ci, mi, ti))
                if l:
                    beta[p, l] = model.new_bool_var(f"b_{p}_{l}")
                    model.add(ci[p, l] == ci[p, l - 1]).only_enforce_if(~beta[p, l])  # [C2]
            model.add(sum(beta[p, l] for l in range(1, tb.layers)) <= self.sub.max_stages - 1)  # [C5]
        start = self._starts(z, beta)
        return LayoutVars(z=z, beta=beta, start=start, type_index=ci, machine_index=mi, tp_index=ti,
                          device_use=self._device_use(start))

    def _layer_type(self, p: int, l: int, z: dict, indices: tuple[dict, dict, dict]) -> None:
        """[C1] exactly one type per layer; its type, machine and TP-size indices."""
        tb, (ci, mi, ti) = self.tb, indices
        tp_index = {t: i for i, t in enumerate(tb.tp_values)}
        zs = [self.model.new_bool_var(f"z_{p}_{l}_{c}") for c in self.C]
        self.model.add_exactly_one(zs)
        for c in self.C:
            z[p, l, c] = zs[c]
        ci[p, l] = self.int_var(sum(c * zs[c] for c in self.C), len(tb.types) - 1, f"ci_{p}_{l}")
        mi[p, l] = self.int_var(sum(tb.types[c].machine * zs[c] for c in self.C), self.nk - 1, f"mi_{p}_{l}")
        ti[p, l] = self.int_var(sum(tp_index[tb.types[c].tp] * zs[c] for c in self.C),
                                len(tp_index) - 1, f"ti_{p}_{l}")

    def _starts(self, z: dict, beta: dict) -> dict:
        """[C3] start[p, ℓ, c] ≥ z ∧ β (a stage of type c starts at ℓ); start[p, 0, c] = z."""
        start = {}
        for (p, l, c), zv in z.items():
            if l == 0:
                start[p, l, c] = zv
                continue
            start[p, l, c] = self.model.new_bool_var(f"s_{p}_{l}_{c}")
            self.model.add_bool_or([~zv, ~beta[p, l], start[p, l, c]])
        return start

    def _device_use(self, start: dict) -> dict:
        """a[p, M] = Σ t·start over M's types; [C4] Σ_p a[p, M] ≤ count_M."""
        tb, machines = self.tb, self.tb.cluster.machines
        use = {(p, k): [] for p in self.P for k in range(self.nk)}
        for (p, l, c), s in start.items():
            use[p, tb.types[c].machine].append(tb.types[c].tp * s)
        device_use = {(p, k): self.int_var(sum(terms), machines[k].count, f"a_{p}_{k}")
                      for (p, k), terms in use.items()}
        for k in range(self.nk):
            self.model.add(sum(device_use[p, k] for p in self.P) <= machines[k].count)
        return device_use

    # -- [C6] micro-batches, ordered pipelines [R2] ----------------------------------------
    def batches(self) -> dict:
        total = self.tb.total_micro
        micro = {p: self.model.new_int_var(1, total - self.d + 1, f"m_{p}") for p in self.P}
        self.model.add(sum(micro.values()) == total)
        for p in range(self.d - 1):
            self.model.add(micro[p] >= micro[p + 1])
        return micro

    # -- [C7] memory: n ≤ n_max[c, first, last, q] -----------------------------------------
    def memory(self, layout: LayoutVars, micro: dict) -> MemoryVars:
        tb, q_top, n_max = self.tb, self.tb.q_top, self.tb.n_max_for(self.d)  # ZeRO-1: D's memory
        flat = [int(n_max[c, f, last, q]) for c in self.C for f in (0, 1) for last in (0, 1)
                for q in range(q_top + 1)]
        mem = MemoryVars(position={}, first={}, stages_left={}, last={}, in_flight={}, cap={})
        for p in self.P:
            for l in self.L:
                self._position(p, l, layout.beta, mem)
                self._stage_rank(p, l, layout.beta, mem)
                q = mem.in_flight[p, l] = self._in_flight(mem.stages_left[p, l], micro[p], f"q_{p}_{l}")
                idx = self.int_var(((layout.type_index[p, l] * 2 + mem.first[p, l]) * 2 + mem.last[p, l])
                                   * (q_top + 1) + q, len(flat) - 1, f"memx_{p}_{l}")
                cap = mem.cap[p, l] = self.model.new_int_var(0, tb.layers, f"nmax_{p}_{l}")
                self.model.add_element(idx, flat, cap)
                self.model.add(mem.position[p, l] <= cap)
        return mem

    def _position(self, p: int, l: int, beta: dict, mem: MemoryVars) -> None:
        """cnt (layers of the stage up to ℓ) and f (the stage holds layer 0), by enforced
        equalities."""
        model = self.model
        cnt = mem.position[p, l] = model.new_int_var(1, self.tb.layers, f"cnt_{p}_{l}")
        f = mem.first[p, l] = model.new_bool_var(f"f_{p}_{l}")
        if l == 0:
            model.add(cnt == 1)
            model.add(f == 1)
            return
        new = beta[p, l]
        model.add(cnt == mem.position[p, l - 1] + 1).only_enforce_if(~new)
        model.add(cnt == 1).only_enforce_if(new)
        model.add(f == mem.first[p, l - 1]).only_enforce_if(~new)
        model.add(f == 0).only_enforce_if(new)

    def _stage_rank(self, p: int, l: int, beta: dict, mem: MemoryVars) -> None:
        """r = 1 + Σ_{ℓ' > ℓ} β (= S − k of ℓ's stage) and last ⇔ r = 1."""
        r = mem.stages_left[p, l] = self.int_var(1 + sum(beta[p, k] for k in range(l + 1, self.tb.layers)),
                                                 self.sub.max_stages, f"r_{p}_{l}")
        last = mem.last[p, l] = self.model.new_bool_var(f"last_{p}_{l}")
        self.model.add(r == 1).only_enforce_if(last)
        self.model.add(r >= 2).only_enforce_if(~last)

    def _in_flight(self, stages_left, micro, name: str) -> cp_model.IntVar:
        """q of §3.5 under the training's schedule: 1F1B min(r, m_p), GPipe m_p."""
        q = self.model.new_int_var(1, self.tb.q_top, name)
        if in_flight_rule(self.tb.training) == "stages":
            self.model.add_min_equality(q, [stages_left, micro])
        else:
            self.model.add(q == micro)
        return q

    # -- [C8]–[C10] stage times, pipeline traffic, 1F1B --------------------------------------
    def pipe_times(self, layout: LayoutVars, micro: dict) -> TimeVars:
        sc, big_l = self.scale, self.tb.layers
        times = TimeVars(running={}, traffic={}, slowest={}, steady={}, pipe={}, bubble={})
        for p in self.P:
            work = [sum(sc.tau_layer[c] * layout.z[p, l, c] for c in self.C) for l in self.L]
            head = sum(sc.tau_head[c] * layout.z[p, big_l - 1, c] for c in self.C)
            parts = self._stage_times(p, layout.beta, work, head, times)
            pps = self._traffic(p, layout, times)
            slowest = times.slowest[p] = self.model.new_int_var(0, sc.r_top, f"R_{p}")
            self.model.add_max_equality(slowest, parts + pps)
            self._machine_balance(p, layout.z, slowest)
            m1 = self.model.new_int_var(0, self.tb.total_micro - self.d, f"m1_{p}")
            self.model.add(m1 == micro[p] - 1)
            steady = times.steady[p] = self.model.new_int_var(0, sc.steady_top, f"steady_{p}")
            self.model.add_multiplication_equality(steady, [m1, slowest])  # [C10] (m_p − 1)·R_p
            times.bubble[p] = sum(work) + head + sum(pps)
            times.pipe[p] = self.int_var(times.bubble[p] + steady, sc.bubble_top + sc.steady_top, f"pipe_{p}")
        return times

    def _stage_times(self, p: int, beta: dict, work: list, head, times: TimeVars) -> list:
        """[C8] τ accumulates inside a stage (acc at a stage's last layer is its τ; the last
        layer adds the head)."""
        model, top = self.model, self.scale.r_top
        parts = []
        for l in self.L:
            acc = times.running[p, l] = model.new_int_var(0, top, f"acc_{p}_{l}")
            if l == 0:
                model.add(acc == work[0])
            else:
                model.add(acc == times.running[p, l - 1] + work[l]).only_enforce_if(~beta[p, l])
                model.add(acc == work[l]).only_enforce_if(beta[p, l])
            parts.append(acc)
        parts[-1] = times.running[p, "head"] = self.int_var(parts[-1] + head, top, f"acch_{p}")
        return parts

    def _traffic(self, p: int, layout: LayoutVars, times: TimeVars) -> list:
        """[C9] T_pp = link(M, M') + broadcast(c') at a stage boundary, else 0."""
        model, sc, nk, mi = self.model, self.scale, self.nk, layout.machine_index
        pps = []
        for l in range(1, self.tb.layers):
            pair = self.int_var(mi[p, l - 1] * nk + mi[p, l], nk ** 2 - 1, f"pr_{p}_{l}")
            link = model.new_int_var(0, max(sc.link), f"lk_{p}_{l}")
            model.add_element(pair, sc.link, link)
            bc = model.new_int_var(0, max(sc.bcast), f"bc_{p}_{l}")
            model.add_element(layout.type_index[p, l], sc.bcast, bc)
            pp = times.traffic[p, l] = model.new_int_var(0, sc.r_top, f"pp_{p}_{l}")
            model.add(pp == link + bc).only_enforce_if(layout.beta[p, l])
            model.add(pp == 0).only_enforce_if(~layout.beta[p, l])
            pps.append(pp)
        return pps

    def _machine_balance(self, p: int, z: dict, slowest) -> None:
        """[C8'] Σ_σ on M t_σ·τ_σ ≤ count_M·R_p (a valid cut)."""
        tb, sc, last = self.tb, self.scale, self.tb.layers - 1
        for k in range(self.nk):
            on_k = [c for c in self.C if tb.types[c].machine == k]
            self.model.add(tb.cluster.machines[k].count * slowest >= sum(
                tb.types[c].tp * (sc.tau_layer[c] * sum(z[p, l, c] for l in self.L)
                                  + sc.tau_head[c] * z[p, last, c]) for c in on_k))

    # -- [C11] data-parallel sync over pairs of pipelines, [C16] a tied model's -----------------
    def dp_sync(self, layout: LayoutVars) -> SyncVars:
        tied = tied_sync(self, layout) if self.tb.tied else None
        sync = SyncVars(t_dp=self.model.new_int_var(0, self.scale.dp_top, "T_dp"), t_min={},
                        bandwidth={}, latency={}, running={}, tied=tied)
        if self.d == 1:  # no layer syncs; a tied model's two copies still do [C16]
            self.model.add(sync.t_dp == (tied.bandwidth + tied.latency if tied else 0))
            return sync
        tau = {}
        for l in self.L:
            tau.update(self._layer_sync(l, layout, sync))
        ends = [self._stage_sync(p, layout.beta, tau, sync) for p in self.P]
        self.model.add_max_equality(sync.t_dp, [v for end in ends for v in end])
        return sync

    def _layer_sync(self, l: int, layout: LayoutVars, sync: SyncVars) -> dict:
        """τ_dp(ℓ) per kind = F(t_min, bw_min) + G(α_max), maxima over pairs of holders."""
        model, sc = self.model, self.scale
        t_min = sync.t_min[l] = model.new_int_var(0, len(self.tb.tp_values) - 1, f"tmin_{l}")
        model.add_min_equality(t_min, [layout.tp_index[p, l] for p in self.P])
        kinds = self.tb.sync_kinds(l)
        bw_parts, lat_parts = self._pair_sync(l, layout.machine_index, t_min, kinds)
        g = sync.latency[l] = model.new_int_var(0, max(sc.dp_lat), f"G_{l}")
        model.add_max_equality(g, lat_parts)
        tau = {}
        for kind in kinds:
            f = sync.bandwidth[kind, l] = model.new_int_var(0, max(sc.dp_bw[kind]), f"F_{kind}_{l}")
            model.add_max_equality(f, bw_parts[kind])
            tau[kind, l] = f + g
        return tau

    def _pair_sync(self, l: int, mi: dict, t_min, kinds: list[str]) -> tuple[dict, list]:
        """Element look-ups of the bandwidth and latency parts for every pair of holders of ℓ
        in different pipelines."""
        model, sc, nk, nt = self.model, self.scale, self.nk, len(self.tb.tp_values)
        bw_parts, lat_parts = {k: [] for k in kinds}, []
        for p in self.P:
            for p2 in range(p + 1, self.d):
                pair = self.int_var(mi[p, l] * nk + mi[p2, l], nk ** 2 - 1, f"dp_{l}_{p}_{p2}")
                lat = model.new_int_var(0, max(sc.dp_lat), f"dl_{l}_{p}_{p2}")
                model.add_element(pair, sc.dp_lat, lat)
                lat_parts.append(lat)
                idx = self.int_var(pair * nt + t_min, nk ** 2 * nt - 1, f"dx_{l}_{p}_{p2}")
                for kind in kinds:
                    v = model.new_int_var(0, max(sc.dp_bw[kind]), f"dw_{kind}_{l}_{p}_{p2}")
                    model.add_element(idx, sc.dp_bw[kind], v)
                    bw_parts[kind].append(v)
        return bw_parts, lat_parts

    def _stage_sync(self, p: int, beta: dict, tau: dict, sync: SyncVars) -> list:
        """Σ τ_dp over each stage's layers, running (+emb at ℓ = 0, +head at L − 1; a tied
        model's sync instead at ℓ = 0 and, where the last stage is another stage, at L − 1)."""
        model, top, big_l, tied = self.model, self.scale.dp_top, self.tb.layers, sync.tied
        ends = []
        for l in self.L:
            acc = sync.running[p, l] = model.new_int_var(0, top, f"dacc_{p}_{l}")
            if l == 0:
                model.add(acc == tau["layer", 0] + (tied.bandwidth + tied.latency if tied else tau["emb", 0]))
            else:
                model.add(acc == sync.running[p, l - 1] + tau["layer", l]).only_enforce_if(~beta[p, l])
                model.add(acc == tau["layer", l]).only_enforce_if(beta[p, l])
            ends.append(acc)
        end = tau["head", big_l - 1] if not tied else tied_at_last(self, p, tied)
        ends[-1] = sync.running[p, "head"] = self.int_var(ends[-1] + end, top, f"dacch_{p}")
        return ends

    # -- [C12]–[C13] objective and its cuts ---------------------------------------------------
    def objective(self, times: TimeVars, sync: SyncVars, micro: dict) -> tuple:
        model, sc, cutoff = self.model, self.scale, self.sub.cutoff
        pipe_max = model.new_int_var(0, sc.t_top, "pipe_max")
        model.add_max_equality(pipe_max, [times.pipe[p] for p in self.P])  # [C12]
        total = model.new_int_var(0, sc.t_top, "T")
        model.add(total == pipe_max + sync.t_dp)
        # [C13] valid cuts: m_0 ≥ ⌈B/(b·D)⌉ (pipelines are ordered), and T_dp's floor
        m_low = -(-self.tb.total_micro // self.d)
        model.add(pipe_max >= times.bubble[0] + (m_low - 1) * times.slowest[0])
        # T_dp's floor gives way by the rounding of its floored parts, as [C14]'s cuts do (a plan
        # at exactly that floor was cut off: D = 2 lost, a worse plan or "infeasible" called optimal)
        model.add(sync.t_dp >= max(0, sc.units(self.tb.dp_floor(self.d)) - sc.error_units))
        if cutoff is not None:
            model.add(total <= math.ceil(cutoff / sc.unit))
        return pipe_max, total

    def floor_cuts(self, total, layout: LayoutVars, micro: dict) -> dict:
        """[C14] valid cuts (docs/formulation.md §4): T ≥ the combinatorial bound of D [B2],
        and T ≥ pipe_floor[m_p, a_p] for each pipeline, a_p its devices per machine [B1]/[B3]."""
        # the model's T of a plan is its floored coefficients added up, up to error_units below
        # floor(true T / unit): a cut at a true bound must give way by as much
        sc, slack, floors = self.scale, self.scale.error_units, self.sub.floors
        self.model.add(total >= max(0, sc.units(self.sub.lower_bound) - slack))
        if floors is None:
            return {}
        flat = [max(0, sc.units(x) - slack) if math.isfinite(x) else sc.t_top + 1 for x in floors.table.ravel()]
        out = {}
        for p in self.P:
            alloc = sum(floors.strides[k] * layout.device_use[p, k] for k in range(self.nk))
            idx = self.int_var(micro[p] * floors.num_allocations + alloc, len(flat) - 1, f"fx_{p}")
            value = out[p] = self.model.new_int_var(0, max(flat), f"floor_{p}")
            self.model.add_element(idx, flat, value)
            self.model.add(total >= value)
        return out

    # -- [C15] a fixed structure [B4]/[B5] ---------------------------------------------------
    def structure(self, layout: LayoutVars, micro: dict) -> dict:
        """Pipeline p uses exactly its candidate's stage types (start = z ∧ β exactly,
        Σ_ℓ start[p,ℓ,c] = multiplicity of c) and m_p; with an order, layer ℓ is in stage
        r = Σ_{ℓ' ≤ ℓ} β, of type order[r]."""
        stage_of: dict = {}
        for p, cand in enumerate(self.sub.structure or ()):
            self.model.add(micro[p] == cand.micro_batches)
            for c in self.C:
                self._type_multiplicity(p, c, cand.shape.stages.count(c), layout)
            if cand.order is not None:
                self._stage_order(p, list(cand.order), layout, stage_of)
        return stage_of

    def _type_multiplicity(self, p: int, c: int, times: int, layout: LayoutVars) -> None:
        z, beta, start = layout.z, layout.beta, layout.start
        if not times:
            for l in self.L:
                self.model.add(z[p, l, c] == 0)
            return
        for l in range(1, self.tb.layers):
            self.model.add_implication(start[p, l, c], z[p, l, c])
            self.model.add_implication(start[p, l, c], beta[p, l])
        self.model.add(sum(start[p, l, c] for l in self.L) == times)

    def _stage_order(self, p: int, order: list[int], layout: LayoutVars, stage_of: dict) -> None:
        beta = layout.beta
        self.model.add(sum(beta[p, l] for l in range(1, self.tb.layers)) == len(order) - 1)
        for l in self.L:
            r = stage_of[p, l] = self.int_var(sum(beta[p, k] for k in range(1, l + 1)), len(order) - 1,
                                              f"stage_{p}_{l}")
            self.model.add_element(r, order, layout.type_index[p, l])
