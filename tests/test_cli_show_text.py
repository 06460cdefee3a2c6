"""`hexiscale show` of a plan on few devices: every title and label inside its picture (memory.png
read "(smallest headroo" and "ice id (strip…", the sequence devices.png "bottleneck: lin"). Failed
before the titles and labels were wrapped to the figure's width."""

from __future__ import annotations

import json

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from typer.testing import CliRunner

from hexiscale.cli import app

DEMO_ASYM_PLAN = {"format": "hexiscale.plan/1", "problem": "demo-asym", "pipelines": [
    {"batch": 16, "stages": [{"devices": [0, 1], "layers": 9}, {"devices": [3], "layers": 1},
                             {"devices": [2], "layers": 2}]}]}


@pytest.fixture
def text_outside(monkeypatch):
    """Each picture's texts that reach past its edges (name → the text), checked as it is saved."""
    outside, save = {}, Figure.savefig

    def checked(fig, path, *args, **kwargs):
        if kwargs.get("bbox_inches") == "tight":  # the saved picture grows to hold every text
            return save(fig, path, *args, **kwargs)
        fig.canvas.draw()  # the layout as saved: legends and wrapped texts placed
        renderer = fig.canvas.get_renderer()
        width, height = fig.bbox.width, fig.bbox.height
        for text in fig.findobj(Text):
            if not text.get_visible() or not text.get_text().strip():
                continue
            box = text.get_window_extent(renderer)
            if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1:
                outside.setdefault(str(path).rsplit("/", 1)[-1], []).append(text.get_text())
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked)
    return outside


@pytest.mark.parametrize("problem", ["demo-asym", "longctx-tiny"])
def test_every_title_and_label_is_inside_the_picture(text_outside, tmp_path, problem):
    plan = "longctx-tiny"
    if problem == "demo-asym":
        plan = str(tmp_path / "plan.json")
        (tmp_path / "plan.json").write_text(json.dumps(DEMO_ASYM_PLAN))
    result = CliRunner().invoke(app, ["show", problem, plan, "-o", str(tmp_path / "pics")])
    assert result.exit_code == 0, result.output
    drawn = sorted(p.name for p in (tmp_path / "pics").iterdir())
    assert drawn == (["cluster.png", "memory.png", "schedule.png"] if problem == "demo-asym"
                     else ["devices.png", "ring.png"])
    assert text_outside == {}
