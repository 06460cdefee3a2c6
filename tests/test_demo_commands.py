"""`make demo` — the first thing the README tells a user to run — works as written: each
`hexiscale` line of the Makefile's demo recipe, read from the Makefile itself (so the test
follows the recipe when it changes), runs from a folder that holds the repository's
`instances/`, exits 0, and leaves what the next line and the user read: the solved plan, its
pictures, and a training run whose loss went down."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def demo_commands() -> list[list[str]]:
    """The demo recipe's hexiscale lines, as argument lists (without the program)."""
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe, "the Makefile has no demo recipe"
    lines = [line.strip() for line in recipe.group(1).splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("$(BIN)/hexiscale ")]


def hexiscale_program() -> str:
    beside = Path(sys.executable).with_name("hexiscale")
    found = str(beside) if beside.exists() else shutil.which("hexiscale")
    if found is None:
        pytest.skip("the hexiscale command is not installed (make install)")
    return found


def test_the_demo_recipe_runs_as_written(tmp_path):
    commands = demo_commands()
    assert [c[0] for c in commands] == ["validate", "solve", "show", "run"]
    (tmp_path / "instances").symlink_to(ROOT / "instances")
    outputs = []
    for args in commands:
        done = subprocess.run([hexiscale_program(), *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"hexiscale {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        outputs.append(done.stdout + done.stderr)
    assert (tmp_path / ".demo-plan.json").exists()
    assert any(p.suffix == ".png" for p in (tmp_path / ".demo-pictures").iterdir())
    losses = re.findall(r"loss (\d+\.\d+) → (\d+\.\d+) over (\d+) steps", outputs[-1])
    assert len(losses) == 1, outputs[-1]
    first, last, steps = losses[0]
    assert float(last) < float(first) and int(steps) == int(commands[-1][commands[-1].index("--steps") + 1])
