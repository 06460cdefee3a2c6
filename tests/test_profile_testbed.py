"""`profile` across the machines of an emulated cluster (runtime/profiling/testbed.py,
docs/calibration.md §9, docs/testbed.md): the inter class is the shaped link, the intra class a
machine's loopback, measured apart; the fitted inter bandwidth is the shaping's; each class's
4-byte α is measured directly beside the fit."""

from __future__ import annotations

import pytest

from planner.io import load_cluster, load_model
from runtime.profiling.fit import profiled_cluster
from runtime.profiling.launcher import ProfileSpec
from runtime.profiling.testbed import check_fits, profile_on_testbed
from runtime.testbed import Testbed
from runtime.testbed.layout import MBIT_PER_GBPS
from tests.testbed_helpers import needs_testbed, state, test_prefix


def spec(machines=(2, 1)) -> ProfileSpec:
    """Two processes on the first machine (its loopback: intra), one on the second (the shaped
    link: inter); messages to 32 MiB, a third of a second each at 800 Mbit/s."""
    return ProfileSpec(machines=machines, model=load_model("tiny"), seq_len=128, micro_batch=1, max_bytes=1 << 25,
                       repeats=5)


def test_a_profile_of_more_machines_than_the_testbed_is_refused():
    bed = Testbed(load_cluster("tiny-2"), prefix=test_prefix())  # not brought up
    with pytest.raises(ValueError, match="3 machines do not fit the testbed's 2"):
        check_fits(bed, spec((1, 1, 1)))


@needs_testbed
@pytest.mark.slow
@pytest.mark.alone
def test_profile_across_emulated_machines_fits_the_shaped_link(tmp_path):
    prefix = test_prefix()
    before = state(prefix)
    with Testbed(load_cluster("tiny-2"), prefix=prefix) as bed:
        result = profile_on_testbed(bed, spec(), tmp_path / "profile")
        shaped_gbps = bed.layout.pair_mbit(0, 1) / MBIT_PER_GBPS
    assert state(prefix) == before
    cluster, reports, notes = profiled_cluster(result, name="tb", gpu_name="cpu", statistic="median")
    assert set(reports) == {"intra", "inter"} and not notes
    inter, intra = reports["inter"].written, reports["intra"].written
    assert inter.bw_gbps == pytest.approx(shaped_gbps, rel=0.10)
    assert cluster.inter_bw_gbps == inter.bw_gbps and intra.bw_gbps > 3 * inter.bw_gbps  # loopback: unshaped
    for report in reports.values():
        assert set(report.direct_latency_us) == {"p2p", "all_reduce"}
        assert all(alpha > 0 for alpha in report.direct_latency_us.values())
