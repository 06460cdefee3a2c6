"""`profile`'s peak is the fastest repetition of any timed GEMM: a GEMM timed in a busy moment
of a shared machine (its mean slower than the model pass's mean over the whole profile) no
longer makes η > 1 and refuses the profile, and the compute price, FLOPs / (peak · η), is the
model pass's measured rate whichever peak was taken. A model pass faster than even the fastest
GEMM repetition is still a bad measurement, refused."""

from __future__ import annotations

import pytest

from planner.calibration import CalibrationError
from planner.workload import ModelSpec
from runtime.profiling.fit import pass_flops, profiled_cluster
from runtime.profiling.launcher import GemmTiming, LinkTiming, ProfileResult, ProfileSpec, Repeated

MODEL = ModelSpec(name="m", layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=128, vocab=128)
SPEC = ProfileSpec(machines=(2,), model=MODEL, seq_len=32, micro_batch=1, max_bytes=1 << 20)
GEMM_FLOPS = 6.0 * 32 * 64 * 64


def links() -> tuple[LinkTiming, ...]:
    """All-reduce, p2p and all-to-all at 1 GB/s and 100 µs: any fit passes."""
    return tuple(LinkTiming.of([1e-4 + x / 1e9], link_class="intra", op=op, ranks=2, nbytes=x)
                 for op in ("p2p", "all_reduce", "all_to_all") for x in SPEC.message_sizes())


def profile_with(gemm_times: list[float], model_rate: float) -> ProfileResult:
    gemm = GemmTiming.of(gemm_times, tokens=32, fan_in=64, fan_out=64)
    flops = pass_flops(SPEC, "layered")
    return ProfileResult(spec=SPEC, host="test", square_gemm=gemm, gemms=(gemm,),
                         model=Repeated.of([flops / model_rate]), model_flops=flops, attention=(),
                         links=links(), memory_gib=4.0, compute_spread=0.0)


@pytest.mark.parametrize("statistic", ["mean", "median", "min"])
def test_a_gemm_timed_in_a_busy_moment_leaves_eta_below_one_and_the_price_unmoved(statistic):
    fastest = 1e-3
    busy = [fastest, 4 * fastest, 4 * fastest]  # mean and median at a quarter of the fastest rate
    model_rate = 0.5 * GEMM_FLOPS / fastest  # faster than the GEMM's mean, half its best
    gpu = profiled_cluster(profile_with(busy, model_rate), name="x", gpu_name="cpu",
                           statistic=statistic)[0].catalog["cpu"]
    assert gpu.peak_tflops * 1e12 == pytest.approx(GEMM_FLOPS / fastest)
    assert gpu.efficiency == pytest.approx(0.5)
    assert gpu.peak_tflops * 1e12 * gpu.efficiency == pytest.approx(model_rate)


def test_a_model_pass_faster_than_any_gemm_repetition_is_refused():
    fastest = 1e-3
    with pytest.raises(CalibrationError, match="outside"):
        profiled_cluster(profile_with([fastest, fastest], 1.2 * GEMM_FLOPS / fastest), name="x", gpu_name="cpu")
