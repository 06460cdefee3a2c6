"""Coefficient tables shared by the exact models and the heuristic (docs/formulation.md §1).

Every number here is a value of a `planner.layered.cost` function at one candidate: a stage
type c = (machine M, TP size t) [R1], a machine pair, a layer count. The models only add
and compare these numbers, so the objective they minimize is docs/cost-model.md §3 term by term.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.base import GIB
from planner.cost import usable_memory_bytes
from planner.layered import cost
from planner.layered.cost import StageShape
from planner.layered.plan import Plan, devices_in_order
from planner.problem import Problem
from planner.base import plural
from solvers.rental import most_compute_within


@dataclass(frozen=True)
class StageType:
    """A stage up to device renaming [R1]: t devices of one machine."""

    machine: int
    tp: int


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline as the models see it: stage types with layer counts, and m_p."""

    stages: tuple[tuple[StageType, int], ...]  # (type, n) in pipeline order
    micro_batches: int


class Tables:
    """Per-problem coefficients, all computed by the cost model."""

    def __init__(self, problem: Problem):
        self.problem = problem
        model, training, cluster = problem.model, problem.training, problem.cluster
        self.model, self.training, self.cluster = model, training, cluster
        self.layers = model.layers
        self.num_machines = len(cluster.machines)
        self.num_devices = cluster.num_devices
        self.total_micro = training.micro_batches
        self.types = [StageType(m, t) for m, mach in enumerate(cluster.machines)
                      for t in model.tp_sizes(mach.count)]
        self.max_stages = min(self.layers, self.num_devices)
        self.max_pipelines = min(self.num_devices, self.total_micro)
        self.budget = problem.budget_per_hour  # rent per hour the plan may spend (None: no budget)

    # -- stage times [3.1]: τ is linear in n, so a stage costs n·τ_layer + [last]·τ_head ---
    @cached_property
    def tau_layer(self) -> np.ndarray:
        return np.array([self._tau(c, 1, 0) for c in self.types])

    @cached_property
    def tau_head(self) -> np.ndarray:
        return np.array([self._tau(c, 0, 1) for c in self.types])

    def shape(self, c: StageType, n: int, last: int = 0, first: int = 0, in_flight=1,
              pipelines: int = 1) -> StageShape:
        """A stage of type c holding n layers in a plan of D = `pipelines`, as the cost model reads it."""
        return StageShape.on(self.cluster, c.machine, c.tp, n, first=first, last=last, in_flight=in_flight,
                             pipelines=pipelines)

    def _tau(self, c: StageType, n: int, last: int) -> float:
        return float(cost.stage_time(self.model, self.training, self.shape(c, n, last)))

    def stage_tau(self, c: StageType, n: int, last: bool) -> float:
        return self._tau(c, n, int(last))

    # -- pipeline traffic [3.2]: T_pp = link part (M → M') + broadcast part (c') -----------
    def pp_time(self, prev_machine: int, nxt: StageType) -> float:
        bw, lat = self.cluster.bw_matrix, self.cluster.lat_matrix
        m, m2 = prev_machine, nxt.machine
        return float(cost.stage_pp_time(self.model, self.training, link_bw_gbps=bw[m, m2],
                                        link_lat_s=lat[m, m2], t_next=nxt.tp,
                                        bw_next_gbps=bw[m2, m2], lat_next_s=lat[m2, m2]))

    @cached_property
    def pp_link(self) -> np.ndarray:
        """[M, M']: T_pp with a receiver of TP 1 (no broadcast)."""
        k = self.num_machines
        return np.array([[self.pp_time(m, StageType(m2, 1)) for m2 in range(k)] for m in range(k)])

    @cached_property
    def pp_bcast(self) -> np.ndarray:
        """[c']: the broadcast share of T_pp into a stage of type c' (0 when t = 1)."""
        return np.array([self.pp_time(c.machine, c) - self.pp_time(c.machine, StageType(c.machine, 1))
                         for c in self.types])

    # -- data-parallel sync [3.4]: τ_dp = bandwidth part(t_min, bw_min) + latency part(α_max)
    def dp_bw_part(self, pipelines: int, params: float, t: int, m1: int, m2: int) -> float:
        bw = self.cluster.bw_matrix[m1, m2]
        return float(cost.dp_layer_time(pipelines, params, self.training, t, bw, 0.0))

    def dp_lat_part(self, pipelines: int, m1: int, m2: int) -> float:
        lat = self.cluster.lat_matrix[m1, m2]
        return float(cost.dp_layer_time(pipelines, 0.0, self.training, 1, 1.0, lat))

    # -- the tied embedding's sync [3.4]: the same split over its n holder stages ------------
    @property
    def tied(self) -> bool:
        """A tied model: "emb" and "head" are one pseudo-layer synced over every first and
        last stage (`tied_bw_part` + `tied_lat_part`), not two pseudo-layers of D holders."""
        return bool(self.model.tied_embeddings)

    def tied_bw_part(self, holders: int, t: int, m1: int, m2: int) -> float:
        bw = self.cluster.bw_matrix[m1, m2]
        return float(cost.tied_sync_time(self.model, self.training, holders, t, bw, 0.0))

    def tied_lat_part(self, holders: int, m1: int, m2: int) -> float:
        lat = self.cluster.lat_matrix[m1, m2]
        return float(cost.tied_sync_time(self.model, self.training, holders, 1, np.inf, lat))

    def sync_kinds(self, layer: int) -> list[str]:
        """The (pseudo-)layers synced with layer ℓ's holders: "emb" at 0 and "head" at L − 1
        unless the model is tied (whose shared matrix is priced by the tied parts)."""
        ends = [] if self.tied else (["emb"] if layer == 0 else []) + (["head"] if layer == self.layers - 1 else [])
        return ["layer"] + ends

    def sync_ceiling(self, pipelines: int) -> float:
        """An upper bound on any stage's Σ τ_dp (L layers, both pseudo-layers and the tied sync
        at their slowest: TP 1, every machine pair), for big-M constants."""
        pairs = [(a, b) for a in range(self.num_machines) for b in range(self.num_machines)]
        lat = max(self.dp_lat_part(pipelines, a, b) for a, b in pairs)
        per = {k: max(self.dp_bw_part(pipelines, p, 1, a, b) for a, b in pairs) + lat
               for k, p in self.pseudo_params.items()}
        tied = max((self.tied_bw_part(2 * pipelines, 1, a, b) + self.tied_lat_part(2 * pipelines, a, b)
                    for a, b in pairs), default=0.0) if self.tied else 0.0
        return self.layers * per["layer"] + per["emb"] + per["head"] + tied

    @property
    def tp_values(self) -> list[int]:
        return sorted({c.tp for c in self.types})

    @property
    def pseudo_params(self) -> dict[str, int]:
        m = self.model
        return {"layer": m.params_per_layer, "emb": m.params_embedding, "head": m.params_head}

    # -- memory [3.5]: the most layers a stage can hold, for each (c, first, last, q) --------
    @cached_property
    def n_max(self) -> np.ndarray:
        """[c, first, last, q] (q = 1..Q at index q): largest n ≤ L that fits in a plan of one
        pipeline, 0 if none. Q is the schedule's most micro-batches in flight (§3.5):
        min(S_max, B/b) under 1F1B, B/b under GPipe (the first stage of the longest pipeline
        with all micro-batches). With ZeRO-1 a plan of D ≥ 2 fits more: `n_max_for(D)`."""
        return self._n_max_table(1)

    def n_max_for(self, pipelines: int) -> np.ndarray:
        """`n_max` in a plan of D = `pipelines`: the same table unless ZeRO-1 shards the optimizer
        state over D ≥ 2 holders (μ_σ = μ − μ_o + μ_o/D, §11), which only lowers memory."""
        if self.training.zero_stage != 1 or pipelines < 2:
            return self.n_max
        if pipelines not in self._n_max_by_d:
            self._n_max_by_d[pipelines] = self._n_max_table(pipelines)
        return self._n_max_by_d[pipelines]

    @property
    def lenient_n_max(self) -> np.ndarray:
        """`n_max` at the D where memory is lowest (the most pipelines): what any plan may fit."""
        return self.n_max_for(self.max_pipelines)

    @cached_property
    def _n_max_by_d(self) -> dict[int, np.ndarray]:
        return {}

    def _n_max_table(self, pipelines: int) -> np.ndarray:
        q_top = max(1, int(cost.in_flight_micro_batches(self.training, self.max_stages, 0, self.total_micro)))
        out = np.zeros((len(self.types), 2, 2, q_top + 1), dtype=int)
        cap = self.cluster.machine_memory_bytes
        q = np.arange(1, q_top + 1)
        for i, c in enumerate(self.types):
            for first in (0, 1):
                for last in (0, 1):
                    out[i, first, last, 1:] = cost.max_layers_fitting(
                        self.model, self.training, self.shape(c, 1, last, first, q, pipelines), cap[c.machine])
                    out[i, first, last, 0] = out[i, first, last, 1]
        return out

    @property
    def q_top(self) -> int:
        return self.n_max.shape[3] - 1

    # -- a lower bound valid for every plan (docs/formulation.md §4) -----------------------
    @cached_property
    def trivial_bound(self) -> float:
        """All micro-batches computed by all devices at once: T ≥ (B/b)·C(whole model, Σπ'), where
        π' = max(π, π_att) per device (a device never does a FLOP faster than that); under a budget,
        Σπ' of the most compute any affordable machine set has."""
        cluster = self.cluster
        fastest = np.maximum(cluster.machine_flops, cluster.machine_attention_flops)[cluster.machine_of_device]
        total = float(fastest.sum())
        if self.budget is not None:  # only the machines a plan can rent compute (docs/prices.md §13)
            total = min(total, most_compute_within(self.problem, self.budget))
        return self._all_work_at(total)

    def _all_work_at(self, flops: float) -> float:
        """Every micro-batch's compute at `flops` FLOP/s (matrices and attention alike)."""
        whole = StageShape(tp=1, layers=self.layers, last=1, flops=flops, attention_flops=flops)
        return self.total_micro * float(cost.stage_compute_time(self.model, self.training, whole))

    def dp_floor(self, pipelines: int) -> float:
        """A lower bound on T_dp for D ≥ 2: the first stage syncs layer 0 and the embedding,
        the last stage the last layer and the head, each at best at the largest TP size, the
        fastest bandwidth and the smallest latency of the cluster; a tied model's two ends are
        one sync over n ≥ D holders, which every holder counts (all-reduce grows with n) [3.4]."""
        if pipelines < 2:
            return 0.0
        bw, lat = self.cluster.bw_matrix, self.cluster.lat_matrix
        fast = np.unravel_index(np.argmax(bw), bw.shape)
        near = np.unravel_index(np.argmin(lat), lat.shape)
        t = max(self.tp_values)
        p = self.pseudo_params
        per = {k: self.dp_bw_part(pipelines, p[k], t, *fast) + self.dp_lat_part(pipelines, *near)
               for k in p}
        if self.tied:
            return per["layer"] + self.tied_bw_part(pipelines, t, *fast) + self.tied_lat_part(pipelines, *near)
        return max(per["layer"] + per["emb"], per["layer"] + per["head"])

    def spread_floor(self, pipelines: int) -> float:
        """[U7] A lower bound on T_dp once D exceeds every machine's device count (0 before): each
        layer's D holders, on disjoint devices, then span machines, so its ring crosses the
        fastest link between two machines at best; a stage of t devices and n layers syncs them
        in n·(bandwidth part at t = 1)/t + n·(latency part) at least, and the pipeline with the
        fewest devices (≤ ⌊N/D⌋) has a stage with n/t ≥ L/⌊N/D⌋ (the mediant of its n_k/t_k)."""
        devices = self.cluster.num_devices
        if pipelines <= max(m.count for m in self.cluster.machines) or pipelines > devices:
            return 0.0
        return self._crossing_sync(pipelines, devices // pipelines)

    def _crossing_sync(self, pipelines: int, most_devices: int) -> float:
        """The least sync of a stage whose layers' rings all cross two machines, in a pipeline of
        at most `most_devices` devices: (L/most)·(bandwidth part at t = 1, the fastest link
        between machines) + the latency part at the least latency between two ([U7], [U8])."""
        fast, near = self._between_machines
        return (self.layers / most_devices * self.dp_bw_part(pipelines, self.pseudo_params["layer"], 1, *fast)
                + self.dp_lat_part(pipelines, *near))

    def one_machine_floor(self, pipelines: int) -> float:
        """[U8] A lower bound on T of the plans whose D pipelines all sit on one machine: it then
        computes every micro-batch alone, T ≥ (B/b)·C(whole model, that machine's Σπ'); the
        least over the machines with at least D devices (inf if none has)."""
        flops = np.maximum(self.cluster.machine_flops, self.cluster.machine_attention_flops)
        return min((self._all_work_at(f * m.count) for f, m in zip(flops, self.cluster.machines)
                    if m.count >= pipelines), default=float("inf"))

    def crossing_sync_floor(self, pipelines: int) -> float:
        """[U8] A lower bound on T_dp of the plans whose D pipelines each sit inside one machine,
        on two machines at least (inf where there are none: D = 1 or one machine): every layer's
        D holders then include two on different machines, so each ring crosses a link between
        machines, and a pipeline inside a machine of at most M_max devices has a stage with
        n/t ≥ L/M_max (as in `spread_floor`)."""
        if pipelines < 2 or len(self.cluster.machines) < 2:
            return float("inf")
        return self._crossing_sync(pipelines, max(m.count for m in self.cluster.machines))

    @cached_property
    def _between_machines(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The machine pairs (two different machines) of the fastest link and the least latency."""
        bw, lat = self.cluster.bw_matrix, self.cluster.lat_matrix
        between = ~np.eye(len(bw), dtype=bool)
        return (np.unravel_index(np.argmax(np.where(between, bw, -np.inf)), bw.shape),
                np.unravel_index(np.argmin(np.where(between, lat, np.inf)), lat.shape))

    def type_index(self, c: StageType) -> int:
        return self.types.index(c)


def build_plan(problem: Problem, specs: list[PipelineSpec]) -> Plan:
    """Turn stage types into concrete devices: each machine hands out its devices in order
    (any choice is equivalent [R1])."""
    devices = devices_in_order(problem.cluster.first_device,
                               [[(c.machine, c.tp) for c, _ in spec.stages] for spec in specs])
    return Plan.from_stages(problem=problem.name,
                            batches=[spec.micro_batches * problem.training.micro_batch for spec in specs],
                            stages=[[(d, n) for d, (_, n) in zip(devs, spec.stages)]
                                    for devs, spec in zip(devices, specs)])


def specs_of_plan(problem: Problem, plan: Plan) -> list[PipelineSpec]:
    """The inverse of build_plan (used for hints)."""
    mach = problem.cluster.machine_of_device
    return [PipelineSpec(stages=tuple((StageType(int(mach[s.devices[0]]), s.tp), s.layers)
                                      for s in p.stages),
                         micro_batches=p.batch // problem.training.micro_batch)
            for p in plan.pipelines]


def _states_and_usable(tables: Tables) -> tuple[float, float]:
    """Bytes of all model states (μ·P) and of the cluster's memory past the per-device reserve."""
    return (cost.model_state_bytes(tables.model, tables.training),
            usable_memory_bytes(tables.cluster, tables.training))


def explain_infeasible(tables: Tables) -> str:
    """Why no plan fits in memory, in the cost model's numbers (checked before solving)."""
    model, training = tables.model, tables.training
    states, usable = _states_and_usable(tables)
    if states > usable:
        return (f"model states need {states / GIB:.1f} GiB (μ={training.param_state_bytes:g} bytes × "
                f"{model.total_params / 1e9:.3g} B parameters), the cluster has {usable / GIB:.1f} GiB "
                f"after the {training.reserved_gib:g} GiB reserve per device")
    nm = tables.lenient_n_max  # ZeRO-1: the most pipelines need the least memory
    if not any(nm[i, 1, 0, 1] >= 1 or nm[i, 1, 1, 1] >= tables.layers for i in range(len(tables.types))):
        return "no stage fits layer 0 with its embedding on any machine, at any TP size"
    if not any(nm[i, 0, 1, 1] >= 1 or nm[i, 1, 1, 1] >= tables.layers for i in range(len(tables.types))):
        return f"no stage fits layer {tables.layers - 1} with the LM head on any machine, at any TP size"
    longest = _longest_pipeline(tables)
    if longest < tables.layers:
        return (f"no pipeline fits in memory: using every device, one pipeline holds at most "
                f"{longest} of the {plural(tables.layers, 'layer')}")
    return ""


def memory_summary(tables: Tables) -> str:
    """The numbers behind an infeasibility that only the models could prove."""
    states, usable = _states_and_usable(tables)
    most = max(int(tables.lenient_n_max[i, 0, 0, 1]) for i in range(len(tables.types)))
    return (f"model states need {states / GIB:.1f} GiB of the cluster's {usable / GIB:.1f} GiB, but "
            f"activations, the embedding, the head and whole-layer stages do not pack: a stage holds "
            f"at most {most} of the {plural(tables.layers, 'layer')}")


def _longest_pipeline(tables: Tables) -> int:
    """Most layers one pipeline could hold with every device and the most lenient memory
    (q = 1, no embedding or head): a necessary condition for feasibility."""
    per_machine = []
    for m, mach in enumerate(tables.cluster.machines):
        best = [0] * (mach.count + 1)  # best[d] = most layers with d devices of machine m
        for d in range(1, mach.count + 1):
            for i, c in enumerate(tables.types):
                if c.machine == m and c.tp <= d:
                    best[d] = max(best[d], best[d - c.tp] + int(tables.lenient_n_max[i, 0, 0, 1]))
            best[d] = max(best[d], best[d - 1])
        per_machine.append(best[-1])
    return sum(per_machine)
