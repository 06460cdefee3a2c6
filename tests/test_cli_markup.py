"""Names are the user's text, printed as written: a machine named "[/]" stopped `evaluate` and
`solve` with rich's MarkupError (exit 3), and a model named "[bold red]m" printed as a red "m".
Every command that prints a name goes through `hexiscale.cli.views.plain`. Failed before it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app

MARKED = """name: marked[/]p
cluster:
  name: c
  inter_bw_gbps: 1.25
  machines:
  - {name: '[/]', gpu: RTX4090, count: 2, intra_bw_gbps: 16, price_per_hour: 0.34}
  - {name: m1, gpu: RTX3090, count: 2, intra_bw_gbps: 16, price_per_hour: 0.22}
model: {name: '[bold red]m', layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 172, vocab: 256}
training: {seq_len: 64, global_batch: 8, micro_batch: 1}
"""


@pytest.fixture
def marked(tmp_path):
    path = tmp_path / "marked.yaml"
    path.write_text(MARKED)
    return path


def _ok(args, *names):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for name in names:
        assert name in result.output, (name, result.output)
    return result


def test_names_with_markup_print_as_written(marked, tmp_path):
    plan = tmp_path / "plan.json"
    _ok(["validate", str(marked)], "problem marked[/]p", "model [bold red]m")
    # every device used: the plan table names the machine "[/]"
    _ok(["solve", str(marked), "-s", "symmetric-all", "-t", "5", "-o", str(plan)], "plan for marked[/]p", " [/] ")
    _ok(["validate", str(marked), str(plan)], "is valid for marked[/]p")
    _ok(["evaluate", str(marked), str(plan)], " [/] ")
    _ok(["compare", str(marked), "-s", "symmetric,heuristic", "-t", "5"], "marked[/]p: [bold red]m on c")
    _ok(["frontier", str(marked), "-t", "5"], "marked[/]p: time–rent frontier")
    _ok(["show", str(marked), str(plan), "-o", str(tmp_path / "pics")], " [/] ")  # the rented machines


def test_an_idle_machine_with_markup_is_named_as_written(marked, tmp_path):
    """A plan on m1 alone: `evaluate` explains why "[/]" idles, naming it."""
    plan = tmp_path / "m1.json"
    plan.write_text('{"format": "hexiscale.plan/1", "problem": "marked[/]p", "pipelines": [{"batch": 8, '
                    '"stages": [{"devices": [2], "layers": 2}, {"devices": [3], "layers": 2}]}]}')
    result = _ok(["evaluate", str(marked), str(plan)], "why the others are idle")
    assert "[/] (2 idle)" in result.output.split("why the others are idle")[1]
