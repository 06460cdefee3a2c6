"""The repository's citations resolve inside the repository (issue 28).

The code, tests, benchmarks and documents cite markdown files ("docs/cost-model.md §3.4",
"runtime/README.md"). A fresh clone must hold every cited file, and every section number
cited with a file must be a heading of that file. The contract once lived outside the
repository, in a file named DESIGN plus ".md"; no file may cite it any more (its sections
are the topic files of docs/, docs/README.md lists them).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve()
SCANNED_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt"}
SCANNED_NAMES = {"Makefile"}
# Folders that are not the repository's own text: environments, caches, build outputs.
SKIPPED_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist",
                "bench-out", ".hexiscale-run", ".demo-pictures", "node_modules"}
OLD_CONTRACT = "DESIGN" + ".md"  # spelled apart so this file does not cite it
OLD_CONTRACT_SHORT = re.compile(r"\bDESIGN\s*§")  # "DESIGN §8", the short form once used

# A markdown path: word characters, dots, slashes and dashes ending in a word character and
# ".md" ("*.md" in prose is not a path); then, optionally, the sections cited with it:
# "§3.4", "§7.2–§7.3", "§2.2, §4", "§10 and §11".
MD_CITATION = re.compile(
    r"(?<![\w/.-])(?P<path>(?:\.\.?/)*[\w][\w./-]*?\w\.md)\b"
    r"(?P<sections>(?:\s*(?:,|–|-|and|/)?\s*§\d+(?:\.\d+)*)*)")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
NUMBERED_HEADING = re.compile(r"^#+\s+(?:§\s*)?(\d+(?:\.\d+)*)\.?(?:\s|$)")


def scanned_files(root: Path) -> list[Path]:
    """The repository's own text files under `root` (sources, tests, docs, instance files);
    skipped folders are never entered (a virtual environment holds thousands of files)."""
    out = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        out += [Path(folder) / n for n in names
                if Path(n).suffix in SCANNED_SUFFIXES or n in SCANNED_NAMES]
    return sorted(out)


@lru_cache(maxsize=None)
def file_sections(path: Path) -> frozenset[str]:
    """`heading_sections` of a file, read once per test run."""
    return frozenset(heading_sections(path.read_text()))


def heading_sections(markdown: str) -> set[str]:
    """Section numbers a markdown file has as headings: "## §3.4 …", "### 2.1 …", "## 4. …"
    (lines inside ``` fences are code, not headings)."""
    numbers, fenced = set(), False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        numbers.update(SECTION.findall(line))
        leading = NUMBERED_HEADING.match(line)
        if leading:
            numbers.add(leading.group(1))
    return numbers


def resolve(cited: str, citing: Path, root: Path) -> Path | None:
    """The cited file, relative to the citing file's folder or to the repository root."""
    for base in (citing.parent, root):
        candidate = (base / cited).resolve()
        if candidate.is_file():
            return candidate
    return None


def citation_problems(text: str, citing: Path, root: Path) -> list[str]:
    """Every broken citation in `text` (the contents of `citing`), as 'where: what' lines:
    a cited .md file that does not exist, a section that is not a heading of the file cited
    with it, or a citation of the old out-of-repository contract."""
    where = citing.relative_to(root) if citing.is_relative_to(root) else citing
    problems = []
    for match in MD_CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        cited = match.group("path")
        if Path(cited).name == OLD_CONTRACT:
            problems.append(f"{where}:{line}: cites {cited}, which is not in the repository (use docs/)")
            continue
        target = resolve(cited, citing, root)
        if target is None:
            problems.append(f"{where}:{line}: cites {cited}, which does not exist")
            continue
        missing = [s for s in SECTION.findall(match.group("sections")) if s not in file_sections(target)]
        if missing:
            problems.append(f"{where}:{line}: cites {cited} §{', §'.join(missing)}, not a heading there")
    for match in OLD_CONTRACT_SHORT.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        problems.append(f"{where}:{line}: cites '{match.group(0)}', the old contract (use docs/)")
    return problems


def test_every_citation_in_the_repository_resolves():
    problems = []
    for path in scanned_files(REPO):
        if path.resolve() != THIS_FILE:
            problems += citation_problems(path.read_text(errors="replace"), path, REPO)
    assert not problems, f"{len(problems)} broken citations:\n" + "\n".join(problems[:60])


# -- the checker itself, on planted citations in a small tree ------------------------------


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "topic.md").write_text(
        "# Topic\n\n## §3 Helpers\n\n## §3.4 Sync\n\n```\n# §9.9 inside a code block\n```\n")
    (tmp_path / "docs" / "exact.md").write_text("# Exact\n\n## 2. Models\n\n### 2.1 CP-SAT\n")
    (tmp_path / "pkg").mkdir()
    return tmp_path


def test_checker_accepts_good_citations(tmp_path):
    root = _tree(tmp_path)
    text = ('"""See docs/topic.md §3.4 and docs/topic.md §3, docs/exact.md §2.1, §2; the\n'
            'index [topic](../docs/topic.md); every `*.md` file."""\n')
    assert citation_problems(text, root / "pkg" / "mod.py", root) == []


def test_checker_finds_a_missing_file(tmp_path):
    root = _tree(tmp_path)
    problems = citation_problems("# docs/nowhere.md §3\n", root / "pkg" / "mod.py", root)
    assert len(problems) == 1 and "docs/nowhere.md, which does not exist" in problems[0]


def test_checker_finds_a_missing_section(tmp_path):
    root = _tree(tmp_path)
    # §9.9 appears only inside a code block, and §2.1 is exact.md's, not topic.md's
    problems = citation_problems("x = 1  # docs/topic.md §3.4, §9.9 and §2.1\n", root / "pkg" / "mod.py", root)
    assert problems == ["pkg/mod.py:1: cites docs/topic.md §9.9, §2.1, not a heading there"]


def test_checker_finds_the_old_contract(tmp_path):
    root = _tree(tmp_path)
    text = f"line one\n# the formula of {OLD_CONTRACT} §3.4\n# routing (DESIGN §8)\n"
    problems = citation_problems(text, root / "pkg" / "mod.py", root)
    assert [p.split(": ")[0] for p in problems] == ["pkg/mod.py:2", "pkg/mod.py:3"]


def test_scan_skips_environments_and_reads_sources(tmp_path):
    root = _tree(tmp_path)
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "site.py").write_text(f"# {OLD_CONTRACT}\n")
    (root / "pkg" / "mod.py").write_text("# docs/topic.md §3\n")
    names = [p.relative_to(root).as_posix() for p in scanned_files(root)]
    assert names == ["docs/exact.md", "docs/topic.md", "pkg/mod.py"]
