"""What `hexiscale compare` names and writes, checked before any solve: a solver given twice (the
same row twice, its plan file written twice), the --csv and --json-file tables over a problem
file read or over each other, and the --plans files, PROBLEM.SOLVER.json, over an input or over
each other (two different problems of one `name:` gave one file, the second's plan replacing the
first's). Paths are compared as files (hexiscale.cli.paths)."""

from __future__ import annotations

from pathlib import Path

from hexiscale.cli.app import fail
from hexiscale.cli.paths import file_read, refuse_same_file
from planner.base import file_stem
from planner.io import problem_to_dict
from planner.problem import Problem
from solvers.registry import DEFAULT_KIND


def split_name(spec: str, kind: str = DEFAULT_KIND) -> tuple[str, str]:
    """`KIND:NAME` → (KIND, NAME); a plain name is one of `kind`'s solvers."""
    return tuple(spec.split(":", 1)) if ":" in spec else (kind, spec)  # type: ignore[return-value]


def plan_file(plans_dir: Path, problem_name: str, spec: str, kind: str) -> Path:
    """Where --plans saves a solver's plan: PROBLEM.SOLVER.json, PROBLEM.KIND-SOLVER.json for a
    solver of another kind than the problem is compared in."""
    row_kind, name = split_name(spec, kind)
    label = name if row_kind == kind else f"{row_kind}-{name}"
    return plans_dir / f"{file_stem(problem_name)}.{label}.json"


def refuse_repeated_solvers(specs: list[str], kind: str) -> None:
    """A solver named twice, as written (`heuristic,heuristic`) or once plain and once as
    `KIND:NAME` of the kind compared in: its row would be the table's twice, and its plan file
    written twice. Refused rather than dropped: a repeat is a typo more often than a wish."""
    seen: dict[tuple[str, str], str] = {}
    for spec in specs:
        first = seen.get(key := split_name(spec, kind))
        if first is not None:
            twice = f"{spec} is named twice" if first == spec else f"{first} and {spec} are the same {kind} solver"
            fail(f"--solvers: {twice}: its row would be repeated; give each solver once")
        seen[key] = spec


def check_tables(problems: list[str], csv_path: Path | None,
                 json_path: Path | None) -> list[tuple[str, Path | None]]:
    """--csv and --json-file neither over a problem file read nor over each other; returns the
    files the --plans files must not be either."""
    taken = [("a problem file read", file_read(source)) for source in problems]
    refuse_same_file(csv_path, "--csv", taken)
    taken.append(("the --csv file", csv_path))
    refuse_same_file(json_path, "--json-file", taken)
    return [*taken, ("the --json-file file", json_path)]


def check_plan_files(plans_dir: Path | None, problems: list[str], loaded: list[Problem],
                     solvers: list[tuple[str, list[str]]], taken: list[tuple[str, Path | None]]) -> None:
    """Every --plans file (for each problem, its plan kind and its solvers) over no file read or
    written, nor over another problem's: the same problem given twice writes the same plans, two
    problems of one name would not."""
    if plans_dir is None:
        return
    writer: dict[Path, int] = {}  # each plan file, by its absolute path → the problem it is written for
    for index, (problem, (kind, specs)) in enumerate(zip(loaded, solvers)):
        for spec in specs:
            path = plan_file(plans_dir, problem.name, spec, kind)
            refuse_same_file(path, "--plans", taken)
            first = writer.setdefault(path.resolve(), index)
            if first != index and problem_to_dict(loaded[first]) != problem_to_dict(problem):
                fail(f"--plans: {problems[first]} and {problems[index]} are two problems named {problem.name!r}: "
                     f"the second's plans would replace the first's ({path}); change the name field of one")
