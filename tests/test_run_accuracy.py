"""`hexiscale run` ends with the mean |error| of its predicted-against-measured table: the mean
of the table's own error column (each stage's τ and the step T), and its worst row named."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hexiscale.cli.run_accuracy import mean_error_line

ROW = re.compile(r"^│\s*(p\d+ s\d+|step)\s*│.*│\s*([+-]\d+\.\d)%\s*│$", re.MULTILINE)
LINE = re.compile(r"mean \|error\| (\d+\.\d) % over the table's (\d+) rows \(worst ([+-]\d+\.\d) %: (.+)\)")


@pytest.mark.slow
def test_the_mean_error_line_is_the_mean_of_the_table_it_follows(tmp_path):
    program = Path(sys.executable).with_name("hexiscale")
    if not program.exists():
        pytest.skip("the hexiscale command is not installed beside this python (make install)")
    done = subprocess.run([str(program), "run", "demo-tiny", "demo-tiny", "--steps", "3", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout[done.stdout.index("predicted (cost model) against measured"):]
    rows = ROW.findall(table[:table.index("└")])
    (line,) = LINE.findall(done.stdout)
    errors = [float(e) for _, e in rows]
    assert int(line[1]) == len(rows) >= 2
    assert float(line[0]) == pytest.approx(sum(abs(e) for e in errors) / len(errors), abs=0.1)
    named = dict(rows)[line[3]]  # the worst row is one of the table's, at the largest |error| (ties as rounded)
    assert float(line[2]) == pytest.approx(float(named), abs=0.1)
    assert abs(float(named)) == pytest.approx(max(abs(e) for e in errors), abs=0.1)


def test_without_a_run_log_there_is_no_line(tmp_path):
    assert mean_error_line(tmp_path) == ""
    assert mean_error_line("") == ""
