"""The commands docs/cli.md and runtime/README.md print run as written, as
tests/test_readme_commands.py does for the README: each line of their ```sh blocks (comments
after `#` dropped) in a fresh empty folder, one after the other, as a reader would type them,
each exiting 0; and runtime/README.md's ```python example, run as a script there. Each
subprocess gets a temporary folder of the test's own (TMPDIR, removed after it), so the
`hexiscale-run-*` logs of runs without `--out` do not pile up in /tmp; it sits right under the
system's temporary folder, since a run's processes meet on a Unix socket under it (107
characters at most, which pytest's own folders under xdist pass). Skipped, and why:

- `hexiscale profile -o measured.yaml` (docs/cli.md): it measures this machine, and on a busy
  one a fit can be meaningless, which it refuses (exit 2, on purpose); tests/test_profile_*.py
  and tests/test_demo_commands.py (`make demo`'s profile) run it;
- `hexiscale testbed up tiny-4` and `hexiscale testbed down` (docs/cli.md): root and iproute2;
  tests/test_testbed.py runs them where the host allows.

Every other line must be a `hexiscale` command, so a new kind of line gets a decision here."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "docs/cli.md"
RUNTIME = ROOT / "runtime/README.md"
SKIPPED = {CLI: {"hexiscale profile -o measured.yaml", "hexiscale testbed up tiny-4", "hexiscale testbed down"},
           RUNTIME: set()}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(doc: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(doc.read_text()) if lang == language]


def every_line(doc: Path) -> list[str]:
    return [line.split(" #")[0].strip() for body in blocks(doc, "sh") for line in body.splitlines()
            if line.split(" #")[0].strip()]


def shell_lines(doc: Path) -> list[str]:
    """The sh blocks' commands, comments dropped, the skipped ones left out."""
    return [line for line in every_line(doc) if line not in SKIPPED[doc]]


def hexiscale_program() -> str:
    beside = Path(sys.executable).with_name("hexiscale")
    if not beside.exists():
        pytest.skip("the hexiscale command is not installed beside this python (make install)")
    return str(beside)


@pytest.fixture
def short_tmpdir():
    """A temporary folder right under the system's (short: the runs' Unix sockets live in it)."""
    folder = Path(tempfile.mkdtemp(prefix="hx-doc-"))
    yield {**os.environ, "TMPDIR": str(folder)}
    shutil.rmtree(folder, ignore_errors=True)


def run_lines(doc: Path, folder: Path, env: dict[str, str]) -> None:
    program = hexiscale_program()
    for line in shell_lines(doc):
        done = subprocess.run([program, *shlex.split(line)[1:]], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, f"{doc.name}: {line}\nexited {done.returncode}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("doc", [CLI, RUNTIME], ids=["cli", "runtime"])
def test_the_doc_prints_commands_and_each_is_a_hexiscale_command_or_skipped_on_purpose(doc):
    assert SKIPPED[doc] <= set(every_line(doc)), "a skipped line left the page: drop it from SKIPPED"
    assert len(shell_lines(doc)) >= 3
    assert all(line.startswith("hexiscale ") for line in shell_lines(doc)), shell_lines(doc)


@pytest.mark.slow
def test_the_cli_page_commands_run_as_written(tmp_path, short_tmpdir):
    run_lines(CLI, tmp_path, short_tmpdir)
    for made in ("plan.json", "seq.json", "survivors.json", "demo-asym-without-3.yaml", "calibrated.yaml",
                 "frontier/frontier.png", "run/runlog.json", "run/loss.png", "hf/config.json", "tr/job.json"):
        assert (tmp_path / made).exists(), made
    pictures = {p.name for p in (tmp_path / "pictures").iterdir()}
    assert {"cluster.png", "schedule.png", "memory.png", "ring.png", "devices.png"} <= pictures


@pytest.mark.slow
def test_the_runtime_readme_commands_run_as_written(tmp_path, short_tmpdir):
    run_lines(RUNTIME, tmp_path, short_tmpdir)
    assert (tmp_path / "ck" / "step-00000004" / "manifest.json").exists()
    assert (tmp_path / "ck2" / "step-00000008" / "manifest.json").exists()
    (example,) = blocks(RUNTIME, "python")
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=short_tmpdir,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr


def plan_examples() -> list[tuple[str, str]]:
    """(doc name, JSON text) of every plan file example in docs/ (a ```json block with a plan format)."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for block in blocks(doc, "json"):
            if '"format": "hexiscale.' in block and "plan/1" in block:
                found.append((doc.name, block))
    return found


@pytest.mark.parametrize("doc, block", plan_examples(), ids=[d for d, _ in plan_examples()])
def test_every_plan_example_in_the_docs_is_valid_for_the_problem_it_names(doc, block, tmp_path):
    """A reader who pastes an example plan gets a valid plan (two had named a problem that did
    not exist, or broken its batch and memory rules)."""
    import hexiscale as hx

    (tmp_path / "plan.json").write_text(block)
    plan = hx.load_plan(tmp_path / "plan.json")
    assert hx.validate(hx.load_problem(plan.problem), plan) == []


def test_the_docs_hold_both_kinds_of_plan_example():
    import json

    assert {json.loads(b)["format"] for _, b in plan_examples()} == {"hexiscale.plan/1", "hexiscale.seqplan/1"}
