"""The cross-vendor bridge in `evaluate`, `solve` and `show` (docs/vendors.md §8): shown with the
planner's figures on a mixed-vendor cluster, absent on a one-vendor one."""

from __future__ import annotations

from typer.testing import CliRunner

from hexiscale.cli import app
from hexiscale.cli.vendor_views import format_bytes
from planner.base import format_seconds
from planner.io import load_plan, load_problem
from planner.layered.bridge import layered_bridge_traffic

TITLE = "cross-vendor traffic"


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # rich wraps at the console width


def test_evaluate_and_show_mark_the_bridge(tmp_path):
    problem, plan = load_problem("tiny-mixed-4-tiny"), load_plan("tiny-mixed-4")
    traffic = layered_bridge_traffic(problem, plan)
    assert traffic.bytes_by_kind["pp"] > 0 and traffic.bytes_by_kind["dp"] > 0 and 0 < traffic.share < 1
    expected = (f"{format_seconds(traffic.bridge_s)} of T ({traffic.share:.1%}) in bridge-bound terms; "
                f"{format_bytes(traffic.bytes_per_step)} per iteration over the bridge")
    for out in (invoke("evaluate", "tiny-mixed-4-tiny", "tiny-mixed-4"),
                invoke("show", "tiny-mixed-4-tiny", "tiny-mixed-4", "--out", str(tmp_path))):
        assert TITLE in out and expected in out


def test_one_vendor_clusters_show_no_bridge():
    assert TITLE not in invoke("evaluate", "demo-tiny", "demo-tiny")


def test_solve_on_a_mixed_sequence_problem_marks_the_bridge():
    out = invoke("solve", "longctx-h100-mi300x-llama3-8b-128k", "--kind", "sequence", "--time-limit", "5")
    assert TITLE in out and "per iteration over the bridge (ring" in out
    assert format_bytes(131072) == "131.1 kB" and format_bytes(12) == "12 B"


def test_evaluate_a_sequence_plan_on_a_mixed_cluster(tmp_path):
    """longctx-tiny-4 holds an MI250X: the bundled plan's replicas sync across the bridge."""
    from planner.sequence.bridge import sequence_bridge_traffic
    traffic = sequence_bridge_traffic(load_problem("longctx-tiny"), load_plan("longctx-tiny"))
    assert traffic.bytes_by_kind["dp"] > 0 and traffic.bytes_by_kind["ring"] == 0
    for out in (invoke("evaluate", "longctx-tiny", "longctx-tiny"),
                invoke("show", "longctx-tiny", "longctx-tiny", "--out", str(tmp_path))):
        assert f"({traffic.share:.1%}) in bridge-bound terms" in out
        assert f"(ring 0 B, zero 0 B, dp {format_bytes(traffic.bytes_by_kind['dp'])})" in out
