"""Refitting a cluster's figures from run records (DESIGN.md §9, `hexiscale calibrate`).

A run record holds what a layered plan's run measured: each stage's forward + backward time
per micro-batch (the cost model's τ = C + T_tp) and the step time (its T). The unknowns are
scale factors: one per GPU type on 1/η (compute time ∝ 1/η) and one per link class on 1/bw
("intra": every machine's own links; "inter": the links between machines). Every priced
figure of a plan is the cost model's breakdown (`planner.layered.pricing`); it is linear in
those factors wherever no max or min of §3 changes its argument, so each row's regressors are
the breakdown's own slopes, taken by re-pricing the plan with one factor moved, and the
latency terms (not refitted) are what is left. A few Gauss-Newton rounds re-linearise where
a max moved. Least squares on relative error; no second formula of the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.calibration import CalibrationError, checked_efficiency, least_squares
from planner.hardware import Cluster
from planner.layered.plan import Plan
from planner.layered.pricing import breakdown
from planner.layered.table import stage_table
from planner.problem import Problem

LINK_CLASSES = ("intra", "inter")
ROUNDS = 4
STEP = 1e-3  # relative move of one factor when taking a slope (the terms are piecewise linear)


@dataclass(frozen=True)
class RunRecord:
    """One run's measurements. `problem` is the problem as run (the model actually trained,
    the run's seq_len, micro-batch, recompute and schedule); stages in plan order."""

    problem: Problem
    plan: Plan
    stage_s: tuple[float, ...]  # forward + backward per micro-batch of each stage, median over steps
    step_s: float  # step time (schedule + gradient sync), median over steps
    source: str = ""


@dataclass(frozen=True)
class Figure:
    """One refitted figure: which, its value before and after."""

    kind: str  # "efficiency" (of a GPU type) or "bandwidth" (of a link class)
    name: str
    before: float
    after: float
    exercised: bool  # False: no record depends on it; kept as it was


def predicted_rows(problem: Problem, plan: Plan) -> np.ndarray:
    """[τ of each stage, then T]: the cost model's figures that a run record measures."""
    priced = breakdown(problem, stage_table(problem, plan))
    return np.concatenate([priced.tau, [priced.iteration]])


def measured_rows(record: RunRecord) -> np.ndarray:
    return np.array([*record.stage_s, record.step_s], dtype=float)


def used_gpu_types(records: list[RunRecord]) -> list[str]:
    names = {r.problem.cluster.machines[int(m)].gpu
             for r in records for m in stage_table(r.problem, r.plan).machine}
    return sorted(names)


def scaled_cluster(cluster: Cluster, compute: dict[str, float], links: dict[str, float]) -> Cluster:
    """`cluster` with η of each named GPU type divided by its factor and each link class's
    bandwidths divided by its factor (latencies unchanged). Built and validated afresh."""
    data = cluster.model_dump()
    own = {g["name"]: g for g in data["gpu_types"]}
    for name, factor in compute.items():
        entry = own.get(name) or cluster.catalog[name].model_dump()
        own[name] = {**entry, "efficiency": entry["efficiency"] / factor}
    data["gpu_types"] = list(own.values())
    for machine in data["machines"]:
        machine["intra_bw_gbps"] /= links.get("intra", 1.0)
    inter = links.get("inter", 1.0)
    data["inter_bw_gbps"] /= inter
    for entry in (*data["racks"], *data["links"]):
        entry["bw_gbps"] /= inter
    return Cluster(**data)


def _priced(records: list[RunRecord], cluster: Cluster) -> np.ndarray:
    return np.concatenate([predicted_rows(r.problem.model_copy(update={"cluster": cluster}), r.plan)
                           for r in records])


def linearise(records: list[RunRecord], base: Cluster, names: list[tuple[str, str]],
              theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slopes: rows × factors, rest: the rows' part no factor scales) at factors `theta`."""
    def cluster_at(values: np.ndarray) -> Cluster:
        compute = {n: float(v) for (k, n), v in zip(names, values) if k == "efficiency"}
        links = {n: float(v) for (k, n), v in zip(names, values) if k == "bandwidth"}
        return scaled_cluster(base, compute, links)

    at = _priced(records, cluster_at(theta))
    slopes = np.empty((len(at), len(names)))
    for j in range(len(names)):
        moved = theta.copy()
        moved[j] *= 1.0 + STEP
        slopes[:, j] = (_priced(records, cluster_at(moved)) - at) / (theta[j] * STEP)
    return slopes, at - slopes @ theta


def _check_same_cluster(records: list[RunRecord]) -> Cluster:
    base = records[0].problem.cluster
    canonical = base.model_dump_json()  # not `==`: a priced cluster caches numpy arrays
    for r in records[1:]:
        if r.problem.cluster.model_dump_json() != canonical:
            raise CalibrationError(f"{r.source}: ran on another cluster than {records[0].source}")
    return base


def refit(records: list[RunRecord]) -> tuple[Cluster, list[Figure]]:
    """The records' cluster with η per GPU type and bandwidth per link class refitted by
    least squares over every record's stage and step times."""
    if not records:
        raise CalibrationError("no run records")
    base = _check_same_cluster(records)
    names = [("efficiency", g) for g in used_gpu_types(records)] + [("bandwidth", c) for c in LINK_CLASSES]
    measured = np.concatenate([measured_rows(r) for r in records])
    theta = np.ones(len(names))
    slopes, _ = linearise(records, base, names, theta)
    active = np.flatnonzero(np.abs(slopes).max(axis=0) > 0)
    what = ", ".join(r.source for r in records)
    for _ in range(ROUNDS):
        slopes, rest = linearise(records, base, names, theta)
        theta[active] = least_squares(slopes[:, active], measured, what, offset=rest)
        _check_factors(base, names, theta, what)
    fitted = scaled_cluster(base, {n: theta[j] for j, (k, n) in enumerate(names) if k == "efficiency"},
                            {n: theta[j] for j, (k, n) in enumerate(names) if k == "bandwidth"})
    return fitted, _figures(base, fitted, names, set(active.tolist()))


def _check_factors(base: Cluster, names: list[tuple[str, str]], theta: np.ndarray, what: str) -> None:
    for (kind, name), factor in zip(names, theta):
        if factor <= 0 and kind == "bandwidth":
            raise CalibrationError(f"{what}: fitted bandwidth of the {name} links is not positive")
        if kind == "efficiency":
            eta = base.catalog[name].efficiency / factor if factor > 0 else -1.0
            checked_efficiency(eta, f"{what}: GPU type {name}")


def link_class_bw(cluster: Cluster, link_class: str) -> float:
    """The class's smallest bandwidth (one figure for the report), GB/s."""
    if link_class == "intra":
        return float(cluster.machine_intra_bw.min())
    return float(min([cluster.inter_bw_gbps, *(r.bw_gbps for r in cluster.racks),
                      *(link.bw_gbps for link in cluster.links)]))


def _figures(base: Cluster, fitted: Cluster, names: list[tuple[str, str]], active: set[int]) -> list[Figure]:
    figures = []
    for j, (kind, name) in enumerate(names):
        if kind == "efficiency":
            before, after = base.catalog[name].efficiency, fitted.catalog[name].efficiency
        else:
            before, after = link_class_bw(base, name), link_class_bw(fitted, name)
        figures.append(Figure(kind=kind, name=name, before=before, after=after, exercised=j in active))
    return figures
