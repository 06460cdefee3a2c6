"""Fitting measured times to the cost model's figures (docs/calibration.md §9): pure numpy, no torch.

Every regressor comes from the cost model's own term functions (`planner.cost`): a term that
is linear in 1/bw and α (p2p, all-reduce, broadcast, all-to-all) is evaluated once at
(bw = 1 GB/s, α = 0) — its coefficient of 1/bw — and once at (bw = ∞, α = 1 s) — its
coefficient of α. The same functions that price a plan therefore give the fit its columns;
no formula is written twice. Fits are least squares on relative error (each row divided by
its measurement), so 1 KiB and 256 MiB messages count alike — unless each measurement comes
with its own standard error (in seconds): then each row is divided by that error (weighted
least squares), so a repeatable measurement counts more than a scattered one.

A figure outside physical sense (bandwidth ≤ 0, η > 1) and a fit that cannot determine a
figure (too few points, columns that cannot be told apart) raise `CalibrationError`, and
nothing is written. A link fit whose free latency comes out negative is refitted with α = 0,
the least-squares optimum under α ≥ 0 (`LinkFit.latency_at_zero`).
"""

from __future__ import annotations

from typing import Callable, Literal

import numpy as np
from pydantic import Field

from planner.base import TFLOPS, US, Frozen
from planner.hardware import Cluster, GpuType, Machine, Vendor

# Which summary of repeated timings counts: the mean (the default: a step adds up many
# operations, and a sum's typical value is the sum of their means — on shared cores a
# collective's times have a long tail that the median leaves out), the median (what a
# typical repetition takes) or the fastest (the repetition least disturbed by other work).
Statistic = Literal["mean", "median", "min"]
STATISTICS: tuple[Statistic, ...] = ("mean", "median", "min")


def summarize(samples, statistic: Statistic) -> float:
    values = np.asarray(samples, dtype=float)
    return float({"mean": np.mean, "median": np.median, "min": np.min}[statistic](values))


# A design matrix whose smallest singular value, relative to its largest, is below this
# cannot tell its figures apart: the fit would be noise, so it is refused.
CONDITION_LIMIT = 1e-9
# A figure whose standard error (from the fit's residuals) exceeds this fraction of its value
# is not determined by the measurements: they are consistent with values from near 0 to twice it.
UNDETERMINED = 0.5


class CalibrationError(ValueError):
    """A fit that cannot be made, or whose result makes no physical sense."""


class BandwidthError(CalibrationError):
    """A link's bandwidth that its messages do not determine, or that comes out not positive:
    the transfer is lost in the latency, and larger messages would show it."""


class LinkFit(Frozen):
    """`time = x/bw + α` of one link class, as fitted."""

    bw_gbps: float = Field(gt=0, description="fitted bandwidth, GB/s")
    latency_us: float = Field(ge=0, description="fitted latency, µs")
    latency_at_zero: bool = Field(
        default=False, description="the free fit put α below 0, so it was refitted with α = 0 (the least-squares "
                                   "optimum under α ≥ 0): the messages show no latency beside their transfer")
    points: int = Field(ge=2, description="measurements the fit used")
    rms_rel_error: float = Field(ge=0, description="root-mean-square relative residual of the fit")


def term_regressors(term: Callable[[float, float], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(coefficient of 1/bw [bw in GB/s], coefficient of α [s]) of a cost term that is linear
    in both, e.g. `lambda bw, lat: cost.allreduce_time(n, x, bw, lat)`."""
    inv_bw = np.asarray(term(1.0, 0.0), dtype=float)
    lat = np.asarray(term(np.inf, 1.0), dtype=float)
    return inv_bw, lat


def row_scales(measured: np.ndarray, sigma=None) -> np.ndarray:
    """Each row's standard deviation, up to one common factor: its measurement (relative
    error), or its own standard error `sigma` (seconds) where given."""
    return measured if sigma is None else np.ravel(np.asarray(sigma, dtype=float))


def least_squares(columns: np.ndarray, measured: np.ndarray, what: str, offset=0.0, sigma=None) -> np.ndarray:
    """min ‖(offset + columns·θ − measured)/scale‖², scale per `row_scales`; refuses too few
    points or columns that the points cannot tell apart (names `what`). `offset`: each
    row's part that θ does not scale; `sigma`: each row's standard error, seconds (> 0)."""
    columns, measured = np.atleast_2d(np.asarray(columns, dtype=float)), np.asarray(measured, dtype=float)
    rows, unknowns = columns.shape
    if np.any(~np.isfinite(measured)) or np.any(measured <= 0):
        raise CalibrationError(f"{what}: measured times must be positive and finite")
    if rows < unknowns:
        raise CalibrationError(f"{what}: {rows} measurement(s) cannot determine {unknowns} figure(s)")
    scale = row_scales(measured, sigma)
    if np.any(~(scale > 0)):
        raise CalibrationError(f"{what}: every standard error must be positive")
    weighted = columns / scale[:, None]
    singular = np.linalg.svd(weighted, compute_uv=False)
    if singular[-1] <= CONDITION_LIMIT * singular[0]:
        raise CalibrationError(f"{what}: the measurements cannot tell the {unknowns} figures apart "
                               f"(too few distinct points)")
    target = (measured - np.broadcast_to(np.asarray(offset, dtype=float), measured.shape)) / scale
    theta, *_ = np.linalg.lstsq(weighted, target, rcond=None)
    return theta


def relative_standard_errors(weighted: np.ndarray, inverse: np.ndarray, factors: np.ndarray,
                             target: np.ndarray, least_noise: float = 0.0) -> np.ndarray:
    """Each factor's standard error over its value, for the weighted rows `weighted` (and
    `target`) and `inverse` = (WᵀW)⁻¹: the residuals estimate the rows' noise (0 where the
    fit is exact or there are no spare rows), but never below `least_noise` — 1 where each
    row was divided by its own known standard error: then a few points that happen to line
    up cannot claim more than their repetitions showed."""
    rows, unknowns = weighted.shape
    if rows <= unknowns:
        return np.zeros(unknowns)
    noise = max(least_noise, np.sum((weighted @ factors - target) ** 2) / (rows - unknowns))
    return np.sqrt(noise * np.diag(inverse)) / np.abs(factors)


def rms_relative_error(columns: np.ndarray, theta: np.ndarray, measured: np.ndarray) -> float:
    return float(np.sqrt(np.mean((columns @ theta / measured - 1.0) ** 2)))


# Rounds of re-weighting a fit whose rows' standard errors are relative to their fitted times.
REWEIGHT_ROUNDS = 20


def reweighted_least_squares(columns: np.ndarray, measured: np.ndarray, what: str,
                             relative_error) -> tuple[np.ndarray, np.ndarray]:
    """(θ, each row's standard error in seconds) where each row's standard error is
    `relative_error` of its *fitted* time: weighted least squares, re-weighted by the fit
    until the weights settle. Scaling each error by the measured time instead gives a row
    that came out low a small error too, so the rows that landed low steer the fit — the
    first round too: it starts from the plain least-squares line (the largest times lead it,
    and no row's own luck sets its weight), and from the measured times only where that line
    is not positive at every row. On loaded shared cores a small message's repetitions can
    all land at the floor (the exchange lost in the compute it follows: a mean of 1e-7 s);
    weighted by that, the first round's line went through it and came out with a negative
    bandwidth (−46.7 GB/s, refusing a profile whose 128 MiB all-reduce showed 0.44 GB/s)."""
    relative = np.ravel(np.asarray(relative_error, dtype=float))
    plain = columns @ np.linalg.lstsq(columns, measured, rcond=None)[0]
    scale = plain if np.all(plain > 0) else measured
    for _ in range(REWEIGHT_ROUNDS):
        sigma = relative * scale
        theta = least_squares(columns, measured, what, sigma=sigma)
        fitted = columns @ theta
        if np.any(fitted <= 0) or np.allclose(fitted, scale, rtol=1e-9, atol=0.0):
            break  # converged, or a fit outside physical sense (refused by the caller)
        scale = fitted
    return theta, sigma


def fit_link(inv_bw_coef, lat_coef, measured, what: str = "link", sigma=None, relative_error=None) -> LinkFit:
    """Fit one link class's bw and α to measured times, each row priced by a cost term whose
    regressors `term_regressors` gave. Weights, if known: `sigma`, each time's standard error
    in seconds; or `relative_error`, each time's standard error as a fraction of its true
    time (`reweighted_least_squares`). A negative free α is refitted at α = 0 (the optimum under
    α ≥ 0). Refuses bw ≤ 0 and a bandwidth the messages do
    not determine (messages so small that their transfer is lost in the latency's scatter:
    a standard error above UNDETERMINED of its value). The latency is not held to that: on a
    fast link it is a few µs that the smallest messages may scatter about, and it is the
    bandwidth that prices the large messages of a plan."""
    columns = np.column_stack([np.ravel(inv_bw_coef), np.ravel(lat_coef)])
    measured = np.ravel(np.asarray(measured, dtype=float))
    if len(np.unique(columns[:, 0])) < 2:
        raise BandwidthError(f"{what}: one message size cannot separate bandwidth from latency")
    free = columns  # the columns whose coefficients are fitted
    theta, used_sigma = _weighted_fit(free, measured, what, sigma, relative_error)
    at_zero = bool(theta[1] < 0)
    if at_zero:
        # α ≥ 0: the fit is convex and its free optimum lies outside, so the optimum under the bound
        # lies on it. A link whose latency overlaps the transfer (a token-bucket shaper credits the
        # idle time before a message, docs/calibration.md §9) puts the free intercept about 0,
        # a few µs either side; refusing the whole profile for that made it fail at random.
        free = columns[:, :1]
        theta, used_sigma = _weighted_fit(free, measured, what, sigma, relative_error)
        theta = np.array([theta[0], 0.0])
    inv_bw, lat = theta
    if inv_bw <= 0:
        raise BandwidthError(f"{what}: fitted bandwidth {1 / inv_bw if inv_bw else float('inf'):g} GB/s "
                             f"is not positive")
    scale = row_scales(measured, used_sigma)
    weighted = free / scale[:, None]
    error = relative_standard_errors(weighted, np.linalg.inv(weighted.T @ weighted), theta[:free.shape[1]],
                                     measured / scale, least_noise=0.0 if used_sigma is None else 1.0)[0]
    if error > UNDETERMINED:
        raise BandwidthError(f"{what}: fitted bandwidth {1 / inv_bw:.3g} GB/s has a standard error of "
                             f"±{error:.0%} of its value: these message sizes cannot determine it "
                             f"(measure larger messages)")
    return LinkFit(bw_gbps=1.0 / inv_bw, latency_us=lat / US, latency_at_zero=at_zero, points=len(measured),
                   rms_rel_error=rms_relative_error(columns, theta, measured))


def _weighted_fit(columns: np.ndarray, measured: np.ndarray, what: str, sigma,
                  relative_error) -> tuple[np.ndarray, np.ndarray | None]:
    """(θ, each row's standard error in seconds, None for relative weights): `fit_link`'s weighting."""
    if relative_error is not None:
        return reweighted_least_squares(columns, measured, what, relative_error)
    return least_squares(columns, measured, what, sigma=sigma), sigma


def fit_efficiency(ideal_s, measured_s, what: str = "efficiency") -> float:
    """η from compute times: `ideal_s` is each row's time at η = 1 (the cost model's compute
    term at π = peak), `measured_s` the measured time. Refuses η ≤ 0 or η > 1."""
    ideal = np.ravel(np.asarray(ideal_s, dtype=float))
    (inverse,) = least_squares(ideal[:, None], np.ravel(np.asarray(measured_s, dtype=float)), what)
    return checked_efficiency(1.0 / inverse if inverse > 0 else -1.0, what)


def checked_efficiency(eta: float, what: str) -> float:
    if not 0 < eta <= 1:
        raise CalibrationError(f"{what}: fitted efficiency η = {eta:.3g} is outside (0, 1] "
                               f"(a peak below the achieved rate, or a bad measurement)")
    return float(eta)


class MeasuredDevice(Frozen):
    """A device type as measured by `profile`."""

    name: str = Field(min_length=1, description="GPU type name written to the cluster, e.g. cpu")
    vendor: Vendor = Field(default=Vendor.other, description="nvidia | amd | other")
    peak_flops: float = Field(gt=0, description="best achieved FLOP/s on any measured GEMM (the type's peak)")
    model_flops: float = Field(gt=0, description="achieved FLOP/s on the model's layers, forward + backward")
    memory_gib: float = Field(gt=0, description="memory per device, GiB")
    attention_flops: float | None = Field(
        default=None, gt=0, description="achieved FLOP/s of causal attention alone (its causal FLOPs over "
                                        "its time); None: not measured, η_att = η")
    attention_share: float = Field(
        default=0.0, ge=0, lt=1, description="the attention's part of the model pass's FLOPs (F_att/F_layer "
                                             "weighted as the pass counts them)")

    def efficiencies(self) -> tuple[float, float | None]:
        """(η, η_att). Without an attention measurement η is the pass's rate over peak. With one,
        the pass's time per FLOP is split, 1/model = share/attention + (1 − share)/matrices, so
        that η prices the matrix FLOPs alone and η_att the attention's."""
        what = f"device {self.name}"
        if self.attention_flops is None or self.attention_share == 0:
            return checked_efficiency(self.model_flops / self.peak_flops, what), None
        eta_att = checked_efficiency(self.attention_flops / self.peak_flops, f"{what} attention")
        matrix_time = 1.0 / self.model_flops - self.attention_share / self.attention_flops
        if matrix_time <= 0:
            raise CalibrationError(
                f"{what}: the attention alone ({self.attention_flops / TFLOPS:.3g} TFLOP/s) was timed slower "
                f"than the whole model pass allows ({self.model_flops / TFLOPS:.3g} TFLOP/s with "
                f"{self.attention_share:.0%} of its FLOPs in attention): a noisy measurement")
        return checked_efficiency((1 - self.attention_share) / matrix_time / self.peak_flops, what), eta_att

    def gpu_type(self) -> GpuType:
        eta, eta_att = self.efficiencies()
        return GpuType(name=self.name, vendor=self.vendor, peak_tflops=self.peak_flops / TFLOPS,
                       memory_gib=self.memory_gib, efficiency=eta, attention_efficiency=eta_att)


def measured_cluster(*, name: str, device: MeasuredDevice, machines: list[int], intra: LinkFit,
                     inter: LinkFit) -> Cluster:
    """The cluster file `profile` writes: `machines[i]` devices on machine i, each of the
    measured type (carried in the file's own gpu_types), links as fitted."""
    return Cluster(
        name=name, gpu_types=(device.gpu_type(),),
        machines=tuple(Machine(name=f"{name}-m{i}", gpu=device.name, count=count, intra_bw_gbps=intra.bw_gbps)
                       for i, count in enumerate(machines)),
        inter_bw_gbps=inter.bw_gbps, intra_latency_us=intra.latency_us, inter_latency_us=inter.latency_us)
