"""Every command README.md prints runs as written: each line of its ```sh blocks (comments
after `#` dropped) in a fresh empty folder — the README says the bundled names work from any
folder — one after the other, as a reader would type them, each exiting 0; and its ```python
example, run as a script there. Skipped, and why:

- `make demo`: tests/test_demo_commands.py runs its recipe as written;
- `make test`: the suite this test is part of;
- `make example-hf`: a 30-second training run of its own (`examples/hf_tiny.py`), left to
  `make example-hf` itself.

Every other line must be a `hexiscale` command, so a new kind of line gets a decision here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIPPED = {"make demo", "make test", "make example-hf"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def shell_lines() -> list[str]:
    """The sh blocks' commands, comments dropped, the skipped ones left out."""
    lines = [line.split(" #")[0].strip() for body in blocks("sh") for line in body.splitlines()]
    return [line for line in lines if line and line not in SKIPPED]


def hexiscale_program() -> str:
    beside = Path(sys.executable).with_name("hexiscale")
    if not beside.exists():
        pytest.skip("the hexiscale command is not installed beside this python (make install)")
    return str(beside)


def test_the_readme_prints_commands_and_each_is_a_hexiscale_command_or_skipped_on_purpose():
    every = [line.split(" #")[0].strip() for body in blocks("sh") for line in body.splitlines() if line.strip()]
    assert SKIPPED <= set(every), "a skipped line left the README: drop it from SKIPPED"
    assert len(shell_lines()) >= 5
    assert all(line.startswith("hexiscale ") for line in shell_lines()), shell_lines()


@pytest.mark.slow
def test_the_readme_shell_commands_run_as_written(tmp_path):
    program = hexiscale_program()
    for line in shell_lines():
        done = subprocess.run([program, *line.split()[1:]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"{line}\nexited {done.returncode}:\n{done.stdout}{done.stderr}"
    assert (tmp_path / "plan.json").exists() and (tmp_path / "survivors.json").exists()
    assert any(p.suffix == ".png" for p in (tmp_path / "pictures").iterdir())


def test_the_readme_python_example_runs_as_written(tmp_path):
    (example,) = blocks("python")
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[]" in done.stdout.splitlines()  # validate found no violated rule
    assert (tmp_path / "plan.json").exists()
