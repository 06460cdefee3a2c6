"""benchmarks/bench_profile_testbed.py's per-size page: each size's time against x/rate, from the
saved rows (the summary's count no longer hides them)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_profile_testbed as bench  # noqa: E402


def test_the_sizes_page_prices_each_message_at_the_shaped_rate():
    rows = [{"sizes": [{"bytes": 65536, "moved_bytes": 65536.0, "time_s": 2.75e-3}]}]
    data = {"statistic": "median", "rates": {"200": {"runs": rows, **bench.summary(rows, 0.025)}}}
    page = bench.sizes_markdown(data)
    # 65536 B at 200 Mbit/s (25 MB/s) take 2.621 ms: the measured 2.75 ms is 1.05× that
    assert "| 65536 | 2.750 | 2.621 | 1.05 |" in page
    assert data["rates"]["200"]["runs"] == rows
