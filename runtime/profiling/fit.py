"""From `profile`'s raw measurements to a cluster file (no torch): every link timing priced by
the cost term that the planner prices that operation with (p2p: `cost.p2p_time`; all-reduce:
`cost.allreduce_time`; all-to-all: the sequence plans' `exchange_time`), fitted to
`x/bw + α` by `planner.calibration`. A class's figure in the cluster is the fit of its
all-reduce timings: the operation of the TP and data-parallel terms, whose α a layered plan
pays r·n times per micro-batch. On shared CPU cores, with every exchange timed after compute
as a run meets it, a collective's α (wake-ups, skew) is several times a ping-pong's, so a
joint fit with p2p would price every TP all-reduce too cheap; the p2p a plan prices once per
stage boundary then carries that α too. Each operation's own fit and each operation's direct
large-message bandwidth are reported beside it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from planner import cost
from planner.calibration import CalibrationError, LinkFit, Statistic, MeasuredDevice, fit_link, measured_cluster, term_regressors
from planner.hardware import Cluster
from planner.kinds import PLAN_KINDS
from planner.sequence.cost import exchange_time
from runtime.kinds import runtime_kind
from runtime.profiling.launcher import LinkTiming, ProfileResult, ProfileSpec

# The operation whose fit the cluster file carries, by the kind of plan it is for
# (`RuntimeKind.profiled_op`): the collective that kind leans on. Layered: the all-reduce of
# the TP and gradient terms. Sequence: the all-to-all of the Ulysses exchanges.
DEFAULT_PLANS = "layered"  # `profile --for`'s default
WRITTEN_OP = runtime_kind(DEFAULT_PLANS).profiled_op


def priced_term(timing: LinkTiming):
    """The cost model's time of one measured operation, as a function of (bw, α)."""
    n, x = timing.ranks, float(timing.nbytes)
    if timing.op == "p2p":
        return lambda bw, lat: cost.p2p_time(x, bw, lat)
    if timing.op == "all_reduce":
        return lambda bw, lat: cost.allreduce_time(n, x, bw, lat)
    return lambda bw, lat: exchange_time(x * (n - 1) / n, n, bw, lat)


# The smallest relative standard error a link fit believes: below it a measurement's repeats
# miss what they cannot see (drift between measurements, the timer's resolution), and one
# suspiciously quiet point would outweigh all the others.
MIN_RELATIVE_ERROR = 0.01


def standard_error_s(timing: LinkTiming) -> float:
    """The standard error of one measurement, seconds: its mean's (whichever statistic is
    fitted, that is how far its repetitions scatter; a median or fastest repetition can be
    near 0 where the mean is not)."""
    return max(timing.mean_error, MIN_RELATIVE_ERROR) * timing.mean_s


# Message sizes on each side of a measurement whose relative standard errors are pooled with
# its own (`pooled_relative_errors`): neighbouring sizes scatter alike.
POOLED_SIZES = 2


def pooled_relative_errors(timings: list[LinkTiming]) -> np.ndarray:
    """Each measurement's relative standard error as the median of its own and its
    POOLED_SIZES neighbours' on each side (timings of one operation, by message size): how
    repeatable messages of about that size are, apart from how this one's repetitions fell."""
    order = np.argsort([t.nbytes for t in timings])
    own = np.array([max(timings[i].mean_error, MIN_RELATIVE_ERROR) for i in order])
    pooled = np.array([np.median(own[max(0, k - POOLED_SIZES): k + POOLED_SIZES + 1]) for k in range(len(own))])
    out = np.empty_like(pooled)
    out[order] = pooled
    return out


def fit_timings(timings: list[LinkTiming], what: str, statistic: Statistic = "mean") -> LinkFit:
    """Weighted by how repeatable each measurement is: a 64 MiB message's mean is repeatable
    to 2–5 %, a 1 KiB one's (mostly wake-ups and skew) to 5–25 %; weighting every size alike
    let the scattered small messages pull the bandwidth 20 % off a direct large-message
    measurement. Means are weighted by a model of their error (`pooled_relative_errors` of
    the fitted time, `planner.calibration.reweighted_least_squares`), not by their own: a
    small message's mean is raised by the few repetitions that hit a scheduler hiccup of
    milliseconds, and a size whose repetitions missed them has a low mean and a small
    standard error at once — weighted by its own error it steered the latency low (on the
    bench's profiles α came out at 128–265 µs where TP runs' 256 KiB all-reduces took
    1.1–1.6 ms; 25–36 % low in a simulation of 2–5 % hiccups). A median or a fastest
    repetition carries no hiccup, and is weighted by its repetitions' scatter as before."""
    inv_bw, lat = np.array([term_regressors(priced_term(t)) for t in timings]).T
    values = [t.summary(statistic) for t in timings]
    if statistic == "mean":
        return fit_link(inv_bw, lat, values, what, relative_error=pooled_relative_errors(timings))
    return fit_link(inv_bw, lat, values, what, sigma=[standard_error_s(t) for t in timings])


def reported_fit(timings: list[LinkTiming], what: str, statistic: Statistic) -> LinkFit | str:
    """One operation's own fit, shown beside the written figure; where it makes no physical
    sense the reason is shown instead (it is not written anywhere)."""
    try:
        return fit_timings(timings, what, statistic)
    except CalibrationError as exc:
        return str(exc)


def direct_bw_gbps(timing: LinkTiming, statistic: Statistic) -> float:
    """The bandwidth one measurement shows by itself: the bytes the cost model moves per 1/bw
    (its term's coefficient) over the measured time, latency ignored."""
    inv_bw, _ = term_regressors(priced_term(timing))
    return float(inv_bw) / timing.summary(statistic)


@dataclass(frozen=True)
class ClassReport:
    """One link class: the figure written, each operation's own fit, the direct measurements."""

    link_class: str
    written_op: str  # the operation whose fit the cluster file carries
    written: LinkFit  # its fit
    per_op: dict[str, LinkFit | str]  # a reason where an operation's own fit is refused
    direct: dict[str, tuple[float, int]]  # per operation: (bw GB/s of its largest message, its bytes)
    mean_error: float  # median over the class's measurements of the mean's relative standard error
    direct_latency_us: dict[str, float] = field(default_factory=dict)  # per operation: its 4-byte α (`direct_alpha_s`)


def class_report(result: ProfileResult, link_class: str, what: str, statistic: Statistic,
                 written_op: str = WRITTEN_OP) -> ClassReport | None:
    timings = [t for t in result.links if t.link_class == link_class]
    if not timings:
        return None
    ops = list(dict.fromkeys(t.op for t in timings))
    written = fit_timings([t for t in timings if t.op == written_op], f"{what}: {link_class} links", statistic)
    per_op = {op: written if op == written_op else
              reported_fit([t for t in timings if t.op == op], f"{link_class} {op}", statistic) for op in ops}
    largest = {op: max((t for t in timings if t.op == op), key=lambda t: t.nbytes) for op in ops}
    small = [t for t in result.small_links if t.link_class == link_class]
    return ClassReport(link_class=link_class, written_op=written_op, written=written, per_op=per_op,
                       direct={op: (direct_bw_gbps(t, statistic), t.nbytes) for op, t in largest.items()},
                       mean_error=float(np.median([t.mean_error for t in timings])),
                       direct_latency_us={t.op: direct_alpha_s(t, statistic) * 1e6 for t in small})


def direct_alpha_s(timing: LinkTiming, statistic: Statistic) -> float:
    """The α one small-message measurement shows by itself: its time over the number of α its
    cost term counts (p2p 1, all-reduce 2(n − 1)); its 4 bytes weigh nothing beside α."""
    _, alphas = term_regressors(priced_term(timing))
    return timing.summary(statistic) / float(alphas)


def pass_flops(spec: ProfileSpec, plans: str = DEFAULT_PLANS) -> float:
    """The FLOPs the cost model prices for the timed model pass (forward + backward of one
    micro-batch through every layer and the head; causal attention, docs/cost-model.md §3.6),
    so that η = achieved/peak prices the same FLOPs it was measured on. Both plan kinds count
    them alike (each kind's F_iter: `PlanKind.iteration_flops`)."""
    return PLAN_KINDS[plans].iteration_flops(spec.model, spec.training())


def attention_share(spec: ProfileSpec) -> float:
    """The attention's part of the pass's FLOPs: L·F_att / (L·F_layer + F_head)."""
    model, s = spec.model, spec.seq_len
    att = model.layers * cost.attention_flops_per_token(model, s)
    return att / (model.layers * cost.layer_flops_per_token(model, s) + cost.head_flops_per_token(model))


def attention_rate(result: ProfileResult) -> float | None:
    """Achieved FLOP/s of causal attention alone at the profile's own sequence length (its
    forward + backward: 3·b·s·F_att over the measured median), or None where it was not timed."""
    spec = result.spec
    timing = next((a for a in result.attention if a.seq_len == spec.seq_len), None)
    if timing is None:
        return None
    flops = 3.0 * spec.micro_batch * spec.seq_len * cost.attention_flops_per_token(spec.model, spec.seq_len)
    return flops / timing.seconds


def drift(result: ProfileResult) -> float:
    """(slowest − fastest round) / the rounds' mean of the model pass: how far the machine's
    speed moved while it was profiled (0 with one round)."""
    rounds = result.model_rounds
    return (max(rounds) - min(rounds)) / statistics.fmean(rounds) if len(rounds) > 1 else 0.0


DRIFT_WARNING = 0.10  # above it, `profile` says the machine was not steady


def measured_device(result: ProfileResult, name: str, statistic: Statistic = "mean",
                    plans: str = DEFAULT_PLANS) -> MeasuredDevice:
    """The device type: peak = the best rate any timed GEMM reached (its fastest repetition);
    achieved = the whole model's, its FLOPs counted as the cost model counts them; and the
    attention's own rate, which splits the pass into η (matrices) and η_att (attention):
    `MeasuredDevice.efficiencies`. The peak is the fastest repetition whatever the statistic:
    the GEMMs are timed once, in under a second, and on shared cores their mean can land in a
    busy moment that the model pass's rounds, spread over the whole profile, average out (then
    η = achieved / peak came out above 1 and the profile was refused: 3 of 10 profiles of
    `make demo`'s model on 2 loaded cores). Predictions do not move: every compute price is
    FLOPs / (peak · η), the achieved rate."""
    peak = max(g.rate("min") for g in (result.square_gemm, *result.gemms))
    return MeasuredDevice(name=name, peak_flops=peak,
                          model_flops=pass_flops(result.spec, plans) / result.model.summary(statistic),
                          memory_gib=result.memory_gib, attention_flops=attention_rate(result),
                          attention_share=attention_share(result.spec))


def profiled_cluster(result: ProfileResult, *, name: str, gpu_name: str, what: str = "profile",
                     statistic: Statistic = "mean", plans: str = DEFAULT_PLANS,
                     ) -> tuple[Cluster, dict[str, ClassReport], list[str]]:
    """The cluster file's contents for `plans` of that kind (its `profiled_op`), the per-class
    reports, and notes on what was not measured (a class without two processes takes the
    other class's figure; said, not hidden)."""
    written_op = runtime_kind(plans).profiled_op
    reports = {c: class_report(result, c, what, statistic, written_op) for c in ("intra", "inter")}
    notes = []
    for missing, other, why in (("intra", "inter", "no machine has two processes"),
                                ("inter", "intra", "one machine only")):
        if reports[missing] is None:
            notes.append(f"{missing} links not measured ({why}): written as the measured {other} figure")
    measured = {c: r.written for c, r in reports.items() if r is not None}
    if not measured:
        raise ValueError(f"{what}: no link was measured (profile at least two processes)")
    intra = measured.get("intra", measured.get("inter"))
    inter = measured.get("inter", intra)
    cluster = measured_cluster(name=name, device=measured_device(result, gpu_name, statistic, plans),
                               machines=list(result.spec.machines), intra=intra, inter=inter)
    return cluster, {c: r for c, r in reports.items() if r is not None}, notes
