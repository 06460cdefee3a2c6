"""From `profile`'s raw timings to the cluster file (runtime.profiling.fit, no processes): the
timings are made by the cost model's own terms at known figures, one (bw, α) per operation,
as on shared CPU cores where a collective's α is several times a ping-pong's."""

from __future__ import annotations

import numpy as np
import pytest

from planner import cost
from planner.base import US
from planner.calibration import CalibrationError
from planner.sequence.cost import exchange_time
from planner.workload import ModelSpec
from hexiscale.cli.profile import drift_line
from runtime.profiling.measure import round_points
from runtime.profiling.fit import WRITTEN_OP, direct_bw_gbps, drift, fit_timings, pass_flops, profiled_cluster
from runtime.profiling.launcher import MIN_SECONDS, AttentionTiming, GemmTiming, LinkTiming, ProfileResult, ProfileSpec, Repeated

MODEL = ModelSpec(name="small", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=256)
FIGURES = {"p2p": (3.0, 150.0), "all_reduce": (0.8, 600.0), "all_to_all": (0.5, 400.0)}  # (GB/s, µs) per op


def op_time(op: str, n: int, x: float) -> float:
    bw, lat = FIGURES[op][0], FIGURES[op][1] * US
    if op == "p2p":
        return float(cost.p2p_time(x, bw, lat))
    if op == "all_reduce":
        return float(cost.allreduce_time(n, x, bw, lat))
    return float(exchange_time(x * (n - 1) / n, n, bw, lat))


def result(machines: tuple[int, ...]) -> ProfileResult:
    spec = ProfileSpec(machines=machines, model=MODEL, seq_len=32, micro_batch=1, max_bytes=1 << 24)
    classes = [("intra", machines[0])] * (machines[0] >= 2) + [("inter", len(machines))] * (len(machines) >= 2)
    links = tuple(LinkTiming.of([op_time(op, 2 if op == "p2p" else n, x)], link_class=c, op=op,
                                ranks=2 if op == "p2p" else n, nbytes=x)
                  for c, n in classes for op in FIGURES for x in spec.message_sizes())
    gemm = GemmTiming.of([1e-3], tokens=32, fan_in=64, fan_out=64)
    flops = pass_flops(spec, "layered")  # timed at η = 0.3 of the GEMM's rate
    return ProfileResult(spec=spec, host="test", square_gemm=gemm, gemms=(gemm,),
                         model=Repeated.of([flops / (0.3 * gemm.flops_per_s)]), model_flops=flops, attention=(),
                         links=links, memory_gib=4.0, compute_spread=0.0)


def test_the_cluster_carries_the_all_reduce_fit_and_reports_each_operation():
    cluster, reports, notes = profiled_cluster(result((2, 2)), name="x", gpu_name="cpu")
    bw, lat = FIGURES[WRITTEN_OP]
    assert list(cluster.machine_intra_bw) == pytest.approx([bw, bw], rel=0.01)
    assert cluster.inter_bw_gbps == pytest.approx(bw, rel=0.01)
    assert cluster.intra_latency_us == pytest.approx(lat, rel=0.01)
    assert cluster.inter_latency_us == pytest.approx(lat, rel=0.01)
    assert cluster.catalog["cpu"].efficiency == pytest.approx(0.3)
    for op, (op_bw, op_lat) in FIGURES.items():  # each operation's own fit, beside the written one
        assert reports["inter"].per_op[op].bw_gbps == pytest.approx(op_bw, rel=0.01)
        assert reports["inter"].per_op[op].latency_us == pytest.approx(op_lat, rel=0.01)
    assert notes == []


def test_direct_bandwidth_is_the_terms_bytes_over_the_time():
    x, t = float(1 << 24), 0.02
    two = LinkTiming.of([t], link_class="intra", op="all_reduce", ranks=2, nbytes=1 << 24)
    four = two.model_copy(update={"ranks": 4})
    ping = two.model_copy(update={"op": "p2p"})
    assert direct_bw_gbps(two, "median") == pytest.approx(x / t / 1e9)  # 2(n−1)/n = 1 at n = 2
    assert direct_bw_gbps(four, "median") == pytest.approx(1.5 * x / t / 1e9)
    assert direct_bw_gbps(ping, "median") == pytest.approx(x / t / 1e9)


def test_a_class_not_measured_takes_the_other_and_says_so():
    cluster, reports, notes = profiled_cluster(result((1, 1)), name="x", gpu_name="cpu")
    assert set(reports) == {"inter"}
    assert cluster.machine_intra_bw[0] == pytest.approx(cluster.inter_bw_gbps)
    assert notes == ["intra links not measured (no machine has two processes): written as the measured inter figure"]


def test_repetitions_keep_mean_median_and_fastest():
    timed = Repeated.of([0.004, 0.001, 0.001, -0.0002])  # a difference of noisy times can fall below 0
    assert (timed.summary("median"), timed.summary("min")) == (pytest.approx(0.001), MIN_SECONDS)
    assert timed.summary("mean") == pytest.approx((0.004 + 0.001 + 0.001 + MIN_SECONDS) / 4)
    values = [0.004, 0.001, 0.001, MIN_SECONDS]
    assert timed.mean_error == pytest.approx(np.std(values, ddof=1) / 2 / np.mean(values))


def test_a_cluster_for_sequence_plans_carries_the_all_to_all_fit():
    cluster, reports, _ = profiled_cluster(result((2,)), name="x", gpu_name="cpu", plans="sequence")
    bw, lat = FIGURES["all_to_all"]
    assert reports["intra"].written_op == "all_to_all"
    assert cluster.machine_intra_bw[0] == pytest.approx(bw, rel=0.01)
    assert cluster.intra_latency_us == pytest.approx(lat, rel=0.01)


def test_a_median_near_zero_does_not_outweigh_the_fit():
    """Each small message's median came out at the clamp (half its repetitions added nothing,
    as on loaded shared cores), its mean at 2α: weighted by the mean's standard error in
    seconds, those points count like any other, and the median fit keeps a positive latency
    with the bandwidth the large messages show."""
    bw, lat = 0.8, 600 * US
    rng, timings = np.random.default_rng(0), []
    for x in [float(1 << k) for k in range(10, 25)]:
        true = float(cost.allreduce_time(2, x, bw, lat))
        if x < (1 << 20):
            times = [MIN_SECONDS / 2] * 8 + list(2 * true + 0.1 * true * rng.standard_normal(7))
        else:
            times = list(true * (1 + 0.02 * rng.standard_normal(15)))
        timings.append(LinkTiming.of(times, link_class="intra", op="all_reduce", ranks=2, nbytes=int(x)))
    assert sum(t.seconds <= MIN_SECONDS for t in timings) == 10
    fit = fit_timings(timings, "median", statistic="median")
    assert fit.latency_us > 0 and fit.bw_gbps == pytest.approx(bw, rel=0.05)


def test_messages_too_small_to_determine_the_bandwidth_are_refused():
    """A profile cut at 64 KiB on a 0.8 GB/s link with α = 600 µs, each size repeated 4 times
    with gloo's scatter (20 % under 1 MiB, 3 % above): the all-reduce fit, the one a cluster
    file carries, cannot determine the bandwidth (its largest transfer, 82 µs, is under the
    mean's scatter there, about 130 µs): with these draws it lands at 1.26 GB/s ± 356 %, so
    no cluster comes of it (the CLI then writes nothing) and the reason is given. The same
    scatter over sizes up to 16 MiB gives the bandwidth."""
    bw, lat = 0.8, 600 * US
    rng = np.random.default_rng(0)

    def timings(top: int) -> list[LinkTiming]:
        out = []
        for x in (1 << k for k in range(10, top + 1)):
            scatter = 0.20 if x < (1 << 20) else 0.03
            times = float(cost.allreduce_time(2, x, bw, lat)) * (1 + scatter * rng.standard_normal(4))
            out.append(LinkTiming.of(list(times), link_class="intra", op="all_reduce", ranks=2, nbytes=x))
        return out

    with pytest.raises(CalibrationError, match="cannot determine it"):
        fit_timings(timings(16), "intra links")
    assert fit_timings(timings(24), "intra links").bw_gbps == pytest.approx(bw, rel=0.05)


def test_an_attention_timing_splits_the_pass_into_eta_and_eta_att():
    """With attention timed alone at the profile's sequence length, η prices the matrix FLOPs
    and η_att the attention's: the cost model's compute term at (η, η_att) gives back the
    measured pass time, and η_att is the attention's own rate over peak. Without it, η is the
    whole pass's rate over peak (η_att unset)."""
    raw = result((2,))
    spec, peak = raw.spec, raw.square_gemm.flops_per_s
    s, b, L = spec.seq_len, spec.micro_batch, MODEL.layers
    f_mm, f_att, f_head = 2 * MODEL.matrix_params, 2 * MODEL.hidden * (s + 1), 2 * MODEL.vocab * MODEL.hidden
    att_seconds = 3 * b * s * f_att / (0.05 * peak)  # attention alone runs at 5 % of peak
    timed = raw.model_copy(update={"attention": (AttentionTiming(seq_len=s, seconds=att_seconds),)})
    gpu = profiled_cluster(timed, name="x", gpu_name="cpu")[0].catalog["cpu"]
    assert gpu.attention_efficiency == pytest.approx(0.05, rel=1e-9)
    priced = 3 * b * s * (L * (f_mm / (gpu.efficiency * peak) + f_att / (0.05 * peak)) + f_head / (gpu.efficiency * peak))
    assert priced == pytest.approx(raw.model.summary("mean"), rel=1e-9)
    assert gpu.efficiency > 0.3  # the slow attention no longer drags the matrices' η down
    untimed = profiled_cluster(raw, name="x", gpu_name="cpu")[0].catalog["cpu"]
    assert untimed.efficiency == pytest.approx(0.3) and untimed.attention_efficiency is None


def test_an_attention_slower_than_the_whole_pass_allows_is_refused():
    raw = result((2,))
    spec = raw.spec
    slow = raw.model.summary("mean") * 2  # attention alone takes twice the whole pass
    timed = raw.model_copy(update={"attention": (AttentionTiming(seq_len=spec.seq_len, seconds=slow),)})
    with pytest.raises(CalibrationError, match="noisy measurement"):
        profiled_cluster(timed, name="x", gpu_name="cpu")


@pytest.mark.parametrize("measurements, rounds", [(30, 4), (45, 4), (7, 3), (2, 4), (1, 2), (30, 1)])
def test_the_model_pass_rounds_spread_evenly_over_the_link_measurements(measurements, rounds):
    points = round_points(measurements, rounds)
    assert len(points) == rounds - 1 and all(0 <= i < measurements for i in points)
    assert points == sorted(points) and (not points or points[-1] == measurements - 1)
    # the runs of measurements between two rounds (the first round before them) differ by ≤ 1
    gaps = np.diff([-1, *points])
    assert not len(gaps) or gaps.max() - gaps.min() <= 1


def test_drift_is_the_rounds_spread_and_warns_past_ten_percent():
    raw = result((2,))
    steady = raw.model_copy(update={"model_rounds": (0.100, 0.104, 0.102, 0.098)})
    moved = raw.model_copy(update={"model_rounds": (0.104, 0.130, 0.110, 0.112)})
    assert drift(steady) == pytest.approx(0.006 / 0.101) and drift(moved) == pytest.approx(0.026 / 0.114)
    assert "warning" not in drift_line(steady) and "6%" in drift_line(steady)
    assert "warning" in drift_line(moved) and "23%" in drift_line(moved)
    assert drift(raw) == 0.0 and "not known" in drift_line(raw)  # one round, or a file from before rounds


def test_a_refused_profile_writes_nothing_and_says_where_the_measurements_are(tmp_path, capsys):
    """The same refusal through the CLI's writer: exit 2, no cluster file, one line naming the
    file, the reason, where the raw measurements stay and that --max-bytes was cut short."""
    import typer

    from hexiscale.cli.profile import write_profile

    measured = result((2,))
    small = [t for t in measured.links if t.nbytes <= 1 << 16 or t.op != "all_reduce"]
    rng = np.random.default_rng(0)
    noisy = tuple(LinkTiming.of(list(t.mean_s * (1 + 0.2 * rng.standard_normal(4))), link_class=t.link_class,
                                op=t.op, ranks=t.ranks, nbytes=t.nbytes) if t.op == "all_reduce" else t for t in small)
    cut = measured.model_copy(update={"links": noisy, "spec": measured.spec.model_copy(update={"max_bytes": 1 << 16})})
    out, raw = tmp_path / "cluster.yaml", tmp_path / "profile.json"
    with pytest.raises(typer.Exit) as stopped:
        write_profile(cut, out, "x", "cpu", raw=raw)
    assert stopped.value.exit_code == 2 and not out.exists()
    line = " ".join(capsys.readouterr().err.split())
    assert f"{out}: intra links:" in line and "not written" in line and str(raw) in line
    assert "bandwidth" in line and "--max-bytes" in line


def test_the_max_bytes_hint_follows_the_kind_of_refusal_not_its_words():
    """Only a bandwidth the messages could not determine asks for larger messages; another
    refusal that happens to name a bandwidth does not, and neither does a full-size profile."""
    from hexiscale.cli.profile import _larger_messages_hint
    from planner.calibration import BandwidthError, CalibrationError

    measured = result((2,))
    cut = measured.model_copy(update={"spec": measured.spec.model_copy(update={"max_bytes": 1 << 16})})
    assert "--max-bytes" in _larger_messages_hint(cut, BandwidthError("intra links: ±80%"))
    assert _larger_messages_hint(cut, CalibrationError("bandwidth of another cluster")) == ""
    full = measured.model_copy(update={"spec": measured.spec.model_copy(update={"max_bytes": 1 << 28})})
    assert _larger_messages_hint(full, BandwidthError("intra links: ±80%")) == ""


def hiccup_timings(seed: int, hiccups: float) -> list[LinkTiming]:
    """2-rank all-reduces at 1.7 GB/s and α = 150 µs over 1 KiB…256 MiB, repeated as `profile`
    repeats them (more under 1 MiB), each repetition scattered by 10 % and, with probability
    `hiccups`, delayed by a scheduler hiccup of 2–10 ms (6 ms on average)."""
    rng, out = np.random.default_rng(seed), []
    for x in (1 << k for k in range(10, 29)):
        n = 15 * max(1, min(8, (1 << 20) // x))
        times = (float(cost.allreduce_time(2, x, 1.7, 150 * US)) * (1 + 0.1 * rng.standard_normal(n))
                 + (rng.random(n) < hiccups) * rng.uniform(2e-3, 10e-3, n))
        out.append(LinkTiming.of(list(times), link_class="intra", op="all_reduce", ranks=2, nbytes=x))
    return out


@pytest.mark.parametrize("hiccups", [0.02, 0.05])
def test_the_mean_fit_prices_the_hiccups_a_run_meets(hiccups):
    """A run's all-reduce costs its expected time, hiccups included: on average 6 ms ·
    `hiccups` more, which the cost model's 2α carries, so α = 150 + 3000 · `hiccups` µs
    (210 and 300). Over 40 seeds the mean fit recovers it to 10 % (206.6 and 279.6 µs here)
    and the bandwidth to 2 %; weighting each mean by its own standard error instead — what
    fit_timings did — lands 20 % or more low (154 and 185 µs): the sizes whose repetitions
    missed the hiccups have the lowest means and the smallest errors at once."""
    from planner.calibration import fit_link, term_regressors
    from runtime.profiling.fit import priced_term, standard_error_s

    truth = 150 + 3000 * hiccups
    fitted, own_errors = [], []
    for seed in range(40):
        timings = hiccup_timings(seed, hiccups)
        fit = fit_timings(timings, "intra links")
        fitted.append((fit.bw_gbps, fit.latency_us))
        inv_bw, lat = np.array([term_regressors(priced_term(t)) for t in timings]).T
        own = fit_link(inv_bw, lat, [t.mean_s for t in timings], sigma=[standard_error_s(t) for t in timings])
        own_errors.append(own.latency_us)
    bw, latency = np.mean(fitted, axis=0)
    assert latency == pytest.approx(truth, rel=0.10) and bw == pytest.approx(1.7, rel=0.02)
    assert np.mean(own_errors) < 0.8 * truth


def test_pooled_errors_are_each_sizes_neighbourhood_median():
    """Relative errors 0.3, 0.1, 0.1, 0.5, 0.1, 0.2 by size (given out of order): each is the
    median of itself and up to two sizes on each side — by hand: median(0.3, 0.1, 0.1) = 0.1,
    median(0.3, 0.1, 0.1, 0.5) = 0.2, median(0.3, 0.1, 0.1, 0.5, 0.1) = 0.1,
    median(0.1, 0.1, 0.5, 0.1, 0.2) = 0.1, median(0.1, 0.5, 0.1, 0.2) = 0.15,
    median(0.5, 0.1, 0.2) = 0.2; and never below MIN_RELATIVE_ERROR."""
    from runtime.profiling.fit import MIN_RELATIVE_ERROR, pooled_relative_errors

    errors = [0.3, 0.1, 0.1, 0.5, 0.1, 0.2]
    timings = [LinkTiming(seconds=1e-3, fastest_s=1e-3, mean_s=1e-3, mean_error=e, link_class="intra",
                          op="all_reduce", ranks=2, nbytes=1024 << k) for k, e in enumerate(errors)]
    shuffled = [timings[i] for i in (3, 0, 5, 1, 4, 2)]
    pooled = dict(zip((t.nbytes for t in shuffled), pooled_relative_errors(shuffled)))
    assert [pooled[t.nbytes] for t in timings] == pytest.approx([0.1, 0.2, 0.1, 0.1, 0.15, 0.2])
    quiet = [t.model_copy(update={"mean_error": 0.0}) for t in timings]
    assert np.all(pooled_relative_errors(quiet) == MIN_RELATIVE_ERROR)


def test_profile_for_sequence_writes_the_all_to_all_fit_through_the_cli(tmp_path, monkeypatch):
    """The command `calibrate` tells users to run for sequence plans, `hexiscale profile --for
    sequence`, with the processes' measurements replaced by synthetic ones of known figures:
    the file it writes carries the all-to-all fit and says so in its header."""
    from typer.testing import CliRunner

    import hexiscale.cli.profile as profile_cli
    from hexiscale.cli import app
    from planner.io import load_cluster

    monkeypatch.setattr(profile_cli, "measure", lambda spec, folder: result((2,)))
    out = tmp_path / "seq.yaml"
    ran = CliRunner().invoke(app, ["profile", "-o", str(out), "--for", "sequence", "--max-bytes", str(1 << 20)])
    assert ran.exit_code == 0, ran.output
    bw, lat = FIGURES["all_to_all"]
    written = load_cluster(out)
    assert written.machine_intra_bw[0] == pytest.approx(bw, rel=0.01)
    assert written.intra_latency_us == pytest.approx(lat, rel=0.01)
    assert "links: the all_to_all fit, for sequence plans" in out.read_text().splitlines()[0]
