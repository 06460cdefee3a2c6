"""Refitting a cluster's figures from run records (docs/calibration.md §9, `hexiscale calibrate`).

A run record holds what a run measured: per unit the forward + backward time per micro-batch
— each stage of a layered plan (the cost model's τ = C + T_tp), each replica of a sequence
plan (its slowest member: T_mb of §7.2) —, the step time (T), and the part of each unit's
time spent in its collectives: a TP stage's T_tp, a sequence replica's HP all-to-alls and
ZeRO-3 gathers and scatters (the links alone; fitted only on request, see `refit`). The
unknowns are scale
factors: one per GPU type on 1/η (compute time ∝ 1/η), and per link class ("intra": every
machine's own links; "inter": the links between machines) one on 1/bw and one on the latency
α (on shared CPU cores a collective's cost is mostly its α: the wake-up of the processes it
waits for and their skew at the sync point, which only runs show). Every priced figure of a
plan is the cost model's own pricing (`planner.layered.pricing`, `planner.sequence.pricing`);
it is linear in those factors wherever no max or min changes its argument, so each row's
regressors are the pricing's own slopes, taken by re-pricing the plan with one factor moved.
A few Gauss-Newton rounds re-linearise where a max moved. Least squares on relative error; no
second formula of the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from planner.base import US
from planner.calibration import (CONDITION_LIMIT, UNDETERMINED, CalibrationError, checked_efficiency, least_squares,
                                 relative_standard_errors)
from planner.hardware import Cluster
from planner.kinds import kind_of
from planner.problem import Problem

LINK_CLASSES = ("intra", "inter")
CollectiveKind = Literal["tp", "hp", "zero"]  # a TP stage's T_tp; a sequence replica's HP or ZeRO-3 part of T_mb
ROUNDS = 4
STEP = 1e-3  # relative move of one factor when taking a slope (the terms are piecewise linear)
# Figures whose estimates correlate beyond this with an undetermined one are tangled with it:
# the runs only see their combination (e.g. bandwidth and latency on one message size).
TANGLED = 0.9


@dataclass(frozen=True)
class RunRecord:
    """One run's measurements. `problem` is the problem as run (the model actually trained,
    the run's seq_len, micro-batch, recompute and schedule); units in plan order."""

    problem: Problem
    plan: Any  # a plan of any kind (planner.kinds)
    stage_s: tuple[float, ...]  # forward + backward per micro-batch: of each stage, or of each replica's slowest member
    step_s: float  # step time (schedule + gradient sync), summarized over steps
    source: str = ""
    tp_s: tuple[float, ...] = ()  # layered: each stage's TP collectives per micro-batch (() where not recorded)
    hp_s: tuple[float, ...] = ()  # sequence: each replica's HP all-to-alls per micro-batch (busiest member)
    zero_s: tuple[float, ...] = ()  # sequence: each replica's ZeRO-3 collectives per micro-batch (busiest member)

    def tp_stages(self) -> tuple[int, ...]:
        """The stages whose T_tp the record measured: TP size above 1 and a time recorded."""
        return tuple(i for kind, i in self.collective_rows() if kind == "tp")

    def collective_rows(self) -> tuple[tuple[CollectiveKind, int], ...]:
        """The units' collective times the record measured, as (kind, unit index), by the
        plan's kind: each TP stage's T_tp (layered); each replica's HP all-to-alls and ZeRO-3
        collectives (sequence), where it spent time in them."""
        return kind_of(self.plan).measured_collectives(self)

    def collective_s(self, kind: CollectiveKind, index: int) -> float:
        return {"tp": self.tp_s, "hp": self.hp_s, "zero": self.zero_s}[kind][index]

    def without_collectives(self) -> RunRecord:
        return replace(self, tp_s=(), hp_s=(), zero_s=())


@dataclass(frozen=True)
class Figure:
    """One refitted figure: which, its value before and after."""

    kind: str  # "efficiency" (of a GPU type), "bandwidth" or "latency" (of a link class)
    name: str
    before: float
    after: float
    exercised: bool  # False: no record depends on it; kept as it was
    kept_why: str = ""  # exercised but not determined by the records: kept as it was, and why


def predicted_rows(problem: Problem, plan: Any,
                   collectives: tuple[tuple[CollectiveKind, int], ...] = ()) -> np.ndarray:
    """The cost model's figures that a run record measures, by the plan's kind: [τ of each
    stage, then T] of a layered plan (§3), [T_mb of each replica, then T] of a sequence plan
    (§7.2); then each of `collectives` (`RunRecord.collective_rows`): a stage's T_tp, a
    replica's part of T_mb in HP all-to-alls or in ZeRO-3 collectives."""
    return kind_of(plan).predicted_rows(problem, plan, collectives)


def measured_rows(record: RunRecord) -> np.ndarray:
    return np.array([*record.stage_s, record.step_s, *(record.collective_s(k, i) for k, i in record.collective_rows())],
                    dtype=float)


def used_gpu_types(records: list[RunRecord]) -> list[str]:
    names = {r.problem.cluster.machines[int(r.problem.cluster.machine_of_device[d])].gpu
             for r in records for d in r.plan.devices}
    return sorted(names)


def scaled_cluster(cluster: Cluster, compute: dict[str, float], links: dict[str, float],
                   latencies: dict[str, float] | None = None) -> Cluster:
    """`cluster` with η (and η_att) of each named GPU type divided by its factor, each link class's
    bandwidths divided by its factor and its latencies multiplied by its factor in
    `latencies`. Built and validated afresh."""
    data, latencies = cluster.model_dump(), latencies or {}
    own = {g["name"]: g for g in data["gpu_types"]}
    for name, factor in compute.items():
        entry = own.get(name) or cluster.catalog[name].model_dump()
        att = entry.get("attention_efficiency")  # compute time ∝ the factor: attention's too
        own[name] = {**entry, "efficiency": entry["efficiency"] / factor,
                     "attention_efficiency": None if att is None else att / factor}
    data["gpu_types"] = list(own.values())
    intra_lat, inter_lat = latencies.get("intra", 1.0), latencies.get("inter", 1.0)
    data["intra_latency_us"] *= intra_lat
    for machine in data["machines"]:
        machine["intra_bw_gbps"] /= links.get("intra", 1.0)
        if machine["intra_latency_us"] is not None:
            machine["intra_latency_us"] *= intra_lat
    inter = links.get("inter", 1.0)
    data["inter_bw_gbps"] /= inter
    data["inter_latency_us"] *= inter_lat
    for entry in (*data["racks"], *data["links"]):
        entry["bw_gbps"] /= inter
        if entry["latency_us"] is not None:
            entry["latency_us"] *= inter_lat
    return Cluster(**data)


def cluster_at(base: Cluster, names: list[tuple[str, str]], factors: np.ndarray) -> Cluster:
    """`base` scaled by one factor per named figure (see `scaled_cluster`)."""
    by_kind = {kind: {n: float(v) for (k, n), v in zip(names, factors) if k == kind}
               for kind in ("efficiency", "bandwidth", "latency")}
    return scaled_cluster(base, by_kind["efficiency"], by_kind["bandwidth"], by_kind["latency"])


def _priced(records: list[RunRecord], cluster: Cluster) -> np.ndarray:
    return np.concatenate([predicted_rows(r.problem.model_copy(update={"cluster": cluster}), r.plan, r.collective_rows())
                           for r in records])


def linearise(records: list[RunRecord], base: Cluster, names: list[tuple[str, str]],
              theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slopes: rows × factors, rest: the rows' part no factor scales) at factors `theta`."""
    at = _priced(records, cluster_at(base, names, theta))
    slopes = np.empty((len(at), len(names)))
    for j in range(len(names)):
        moved = theta.copy()
        moved[j] *= 1.0 + STEP
        slopes[:, j] = (_priced(records, cluster_at(base, names, moved)) - at) / (theta[j] * STEP)
    return slopes, at - slopes @ theta


def _check_same_cluster(records: list[RunRecord]) -> Cluster:
    base = records[0].problem.cluster
    canonical = base.model_dump_json()  # not `==`: a priced cluster caches numpy arrays
    for r in records[1:]:
        if r.problem.cluster.model_dump_json() != canonical:
            raise CalibrationError(f"{r.source}: ran on another cluster than {records[0].source}")
    return base


def figure_label(kind: str, name: str) -> str:
    return {"efficiency": f"η of GPU type {name}", "bandwidth": f"bandwidth of the {name} links",
            "latency": f"latency of the {name} links"}[kind]


def refit(records: list[RunRecord], *, keep_undetermined: bool = False,
          collective_times: bool = False) -> tuple[Cluster, list[Figure]]:
    """The records' cluster with η per GPU type and bandwidth and latency per link class
    refitted by least squares over every record's stage and step times (and, with
    `collective_times`, each unit's recorded collective times as rows of their own: a TP
    stage's T_tp, a sequence replica's HP all-to-alls and ZeRO-3 collectives).

    A figure the records cannot determine — indistinguishable from the others, a standard
    error above UNDETERMINED of its value, or a fit outside physical sense — is refused
    (CalibrationError); with `keep_undetermined` it is kept at its logged value instead, said
    in its `Figure`, and the others are refitted without it.

    Why the collective rows are not the default (measured on the TP rows): they pin the intra
    links to what the collectives took, and the compute a TP rank does not share
    (per-operation costs, the slowdown next to collectives: +50–60 % over C at TP 2 here),
    which the cost model has no term for, then lands on η and misprices every plan; without
    them it lands on the TP term's latency, which only TP plans pay. Held out in two of the
    bench's runs, cluster A's TP2 plan came out 26–28 % low with the rows and 13 % without."""
    if not records:
        raise CalibrationError("no run records")
    if not collective_times:
        records = [r.without_collectives() for r in records]
    base = _check_same_cluster(records)
    names = ([("efficiency", g) for g in used_gpu_types(records)] + [("bandwidth", c) for c in LINK_CLASSES]
             + [("latency", c) for c in LINK_CLASSES])
    measured = np.concatenate([measured_rows(r) for r in records])
    if not (np.all(np.isfinite(measured)) and np.all(measured > 0)):  # each row is divided by its time
        raise CalibrationError(f"{', '.join(r.source for r in records)}: measured times must be positive and "
                               f"finite (a stage or step time of {measured[~(np.isfinite(measured) & (measured > 0))][0]:g} s)")
    slopes, _ = linearise(records, base, names, np.ones(len(names)))
    exercised = [j for j in range(len(names)) if np.abs(slopes[:, j]).max() > 0]
    active, kept, what = list(exercised), {}, ", ".join(r.source for r in records)
    while True:
        if not active:
            raise CalibrationError(f"{what}: no figure can be determined from these runs")
        theta, weak = _fit_figures(records, base, names, measured, active, what)
        if weak is None:
            break
        j, reason = weak
        if not keep_undetermined:
            raise CalibrationError(f"{what}: {figure_label(*names[j])}: {reason}")
        active.remove(j)
        kept[j] = reason
    fitted = cluster_at(base, names, theta)
    return fitted, _figures(base, fitted, names, set(exercised), kept)


def _fit_figures(records, base: Cluster, names, measured: np.ndarray, active: list[int],
                 what: str) -> tuple[np.ndarray, tuple[int, str] | None]:
    """Gauss-Newton over the `active` factors (the others stay 1). Returns the factors and a
    figure the records do not determine, with why (None: every one is determined). Of the
    figures tangled with an undetermined one, the one the records load least (the smallest
    mean share of the rows' times) is named: what little they say of it goes first."""
    theta = np.ones(len(names))
    fixed = [j for j in range(len(names)) if j not in active]
    for _ in range(ROUNDS):
        slopes, rest = linearise(records, base, names, theta)
        weighted = slopes[:, active] / measured[:, None]
        _, singular, right = np.linalg.svd(weighted)  # right[-1]: the weakest direction (null when rows < figures)
        if len(measured) < len(active) or singular[-1] <= CONDITION_LIMIT * singular[0]:
            tangled = np.abs(right[-1]) > 0.1 * np.abs(right[-1]).max()
            return theta, (_least_loaded(weighted, tangled, active),
                           "these runs cannot tell it apart from the other figures (too few distinct points)")
        offset = rest + slopes[:, fixed] @ theta[fixed]
        theta[active] = least_squares(slopes[:, active], measured, what, offset=offset)
        bad = _unphysical(base, names, theta, active)
        if bad is not None:
            return theta, bad
    inverse = np.linalg.inv(weighted.T @ weighted)  # the factors' covariance, up to the rows' noise
    errors = relative_standard_errors(weighted, inverse, theta[active], 1.0 - offset / measured)
    if errors.max() <= UNDETERMINED:
        return theta, None
    correlation = inverse / np.sqrt(np.outer(np.diag(inverse), np.diag(inverse)))
    undetermined = errors > UNDETERMINED
    tangled = undetermined | np.any(np.abs(correlation[:, undetermined]) > TANGLED, axis=1)
    j = _least_loaded(weighted, tangled, active)
    return theta, (j, f"standard error ±{errors[active.index(j)]:.0%} of its value: these runs cannot determine it "
                      f"(add runs that load it differently)")


def _least_loaded(weighted: np.ndarray, candidates: np.ndarray, active: list[int]) -> int:
    """The candidate with the smallest mean share of the rows' times at its logged value
    (factor 1: not at the fit's, which an undetermined figure can inflate tenfold)."""
    loads = np.mean(np.abs(weighted), axis=0)
    return active[int(np.argmin(np.where(candidates, loads, np.inf)))]


def _unphysical(base: Cluster, names: list[tuple[str, str]], theta: np.ndarray,
                active: list[int]) -> tuple[int, str] | None:
    for j in active:
        (kind, name), factor = names[j], theta[j]
        if factor <= 0 and kind == "bandwidth":
            return j, "fitted bandwidth is not positive"
        if factor < 0 and kind == "latency":
            return j, "fitted latency is negative"
        if kind == "efficiency":
            eta = base.catalog[name].efficiency / factor if factor > 0 else -1.0
            try:
                checked_efficiency(eta, "efficiency")
            except CalibrationError as exc:
                return j, str(exc)
    return None


def link_class_bw(cluster: Cluster, link_class: str) -> float:
    """The class's smallest bandwidth (one figure for the report), GB/s."""
    if link_class == "intra":
        return float(cluster.machine_intra_bw.min())
    return float(min([cluster.inter_bw_gbps, *(r.bw_gbps for r in cluster.racks),
                      *(link.bw_gbps for link in cluster.links)]))


def link_class_lat_us(cluster: Cluster, link_class: str) -> float:
    """The class's largest latency (one figure for the report), µs."""
    if link_class == "intra":
        return float(cluster.machine_intra_lat.max() / US)
    return float(max([cluster.inter_latency_us, *(r.latency_us or 0.0 for r in cluster.racks),
                      *(link.latency_us or 0.0 for link in cluster.links)]))


CLASS_FIGURE = {"bandwidth": link_class_bw, "latency": link_class_lat_us}


def _figures(base: Cluster, fitted: Cluster, names: list[tuple[str, str]], exercised: set[int],
             kept: dict[int, str]) -> list[Figure]:
    figures = []
    for j, (kind, name) in enumerate(names):
        if kind == "efficiency":
            before, after = base.catalog[name].efficiency, fitted.catalog[name].efficiency
        else:
            before, after = CLASS_FIGURE[kind](base, name), CLASS_FIGURE[kind](fitted, name)
        figures.append(Figure(kind=kind, name=name, before=before, after=after, exercised=j in exercised,
                              kept_why=kept.get(j, "")))
    return figures
