"""Plan kinds are reached through their registries only (issue 28): no module outside a kind's
own folders (`planner/<kind>/`, `solvers/<kind>/`, `runtime/<kind>/`, `hexiscale/**/<kind>_*.py`)
and the registry modules tests which kind a plan is — a kind's name compared or used as a
key, an isinstance with a kind's plan type. Shared code asks the kind's descriptor instead
(`PlanKind`, `SolverKind`, `RuntimeKind`, the views and drawing modules)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from planner.kinds import PLAN_KINDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "solvers", "runtime", "hexiscale")
# the modules that list the kinds (and may name them)
REGISTRIES = {"planner/kinds.py", "solvers/kinds.py", "solvers/registry.py", "runtime/kinds.py",
              "hexiscale/cli/views.py", "hexiscale/viz/__init__.py"}
KIND_NAMES = frozenset(PLAN_KINDS)
PLAN_TYPES = frozenset(k.plan_type.__name__ for k in PLAN_KINDS.values())


def _names_a_kind(node: ast.AST) -> bool:
    """A kind's name as a string literal, or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in KIND_NAMES
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_names_a_kind(e) for e in node.elts)


def _type_name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _branch(node: ast.AST) -> str | None:
    """What kind test `node` is, or None."""
    if isinstance(node, ast.Compare) and any(_names_a_kind(o) for o in (node.left, *node.comparators)):
        return "compares with a kind's name"
    if isinstance(node, ast.Dict) and any(k is not None and _names_a_kind(k) for k in node.keys):
        return "a kind's name as a dict key"
    if isinstance(node, ast.Subscript) and _names_a_kind(node.slice):
        return "looks up by a kind's name"
    if isinstance(node, ast.MatchValue) and _names_a_kind(node.value):
        return "matches a kind's name"
    if isinstance(node, ast.Call) and _type_name(node.func) == "isinstance" and len(node.args) == 2:
        types = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        if any(_type_name(t) in PLAN_TYPES for t in types):
            return "isinstance with a kind's plan type"
    return None


def kind_branches(source: str) -> list[str]:
    """'line N: what' for every kind test in `source`."""
    return [f"line {node.lineno}: {why}" for node in ast.walk(ast.parse(source)) if (why := _branch(node))]


def _is_kinds_own(relative: Path) -> bool:
    parts = relative.parts
    if parts[0] == "hexiscale":
        return any(relative.name.startswith(f"{kind}_") for kind in KIND_NAMES)
    return len(parts) > 2 and parts[1] in KIND_NAMES


def shared_modules() -> list[Path]:
    paths = [p.relative_to(ROOT) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return [p for p in paths if p.as_posix() not in REGISTRIES and not _is_kinds_own(p)]


PLANTED = '''
def f(plan, job, kind, estimate):
    if job.kind == "sequence":
        pass
    if kind != "layered" or kind in ("layered", "sequence"):
        pass
    links = {"layered": "all-reduces", "sequence": "all-to-alls"}[kind]
    if isinstance(plan, SeqPlan) or isinstance(plan, (int, planner.layered.plan.Plan)):
        pass
    match kind:
        case "sequence":
            pass
    return TABLE["layered"]
'''

BENIGN = '''
def g(plan: SeqPlan, plans: str = "layered", kind=None):
    unit = kind_of(plan).unit
    if kind == DEFAULT_KIND or plan.format == "hexiscale.plan/1" or isinstance(plan, Frozen):
        return {"pipeline": unit}["pipeline"]
    return f"{len(kind_of(plan).units(plan))} layered"
'''


def test_the_checker_finds_every_planted_kind_test():
    found = kind_branches(PLANTED)
    whats = [line.split(": ", 1)[1] for line in found]
    assert whats.count("compares with a kind's name") == 3
    assert whats.count("a kind's name as a dict key") == 1
    assert whats.count("looks up by a kind's name") == 1
    assert whats.count("isinstance with a kind's plan type") == 2
    assert whats.count("matches a kind's name") == 1
    assert len(found) == 8


def test_the_checker_leaves_code_that_asks_the_descriptor_alone():
    assert kind_branches(BENIGN) == []


def test_the_scan_covers_the_shared_modules_and_skips_the_kinds_own():
    scanned = {p.as_posix() for p in shared_modules()}
    assert {"solvers/replan.py", "hexiscale/cli/compare.py", "planner/calibration_runs.py"} <= scanned
    assert not scanned & REGISTRIES
    assert not any(p.startswith(("planner/layered/", "solvers/sequence/", "hexiscale/cli/layered_views"))
                   for p in scanned)


@pytest.mark.parametrize("relative", shared_modules(), ids=lambda p: p.as_posix())
def test_no_shared_module_tests_a_plan_kind(relative):
    found = kind_branches((ROOT / relative).read_text())
    assert not found, f"{relative} tests a plan kind (ask its descriptor instead): " + "; ".join(found)


@pytest.mark.parametrize("kind", sorted(KIND_NAMES))
def test_every_kind_has_its_descriptors_views_and_drawings(kind):
    """What the registries find by a kind's name exists for every kind."""
    from hexiscale.cli.views import views_of
    from hexiscale.viz import drawing_of
    from solvers.kinds import SOLVER_KINDS

    assert SOLVER_KINDS[kind].name == kind and callable(SOLVER_KINDS[kind].replanner())
    views = views_of(kind)
    for name in ("plan_table", "estimate_views", "solved_views", "plan_shape", "timed_units", "run_table"):
        assert callable(getattr(views, name)), f"hexiscale/cli/{kind}_views.py has no {name}"
    assert isinstance(views.PREDICTION_TITLE, str)
    assert callable(drawing_of(kind).draw_plan)


def test_solve_auto_chooses_the_kind_and_says_why():
    """`hexiscale.solve` (solvers.choose.solve) on a long-context problem returns a sequence
    plan and says why; on a short one a layered plan; an explicit kind needs no reason."""
    from planner.io import load_problem
    from solvers.choose import choose_kind, solve
    from solvers.common import SolverOptions
    from solvers.sequence import LONG_CONTEXT_TOKENS

    quick = SolverOptions(time_limit_s=5)
    long, short = load_problem("longctx-h100-a100-llama3-8b-64k"), load_problem("demo-tiny")
    assert short.training.seq_len < LONG_CONTEXT_TOKENS <= long.training.seq_len
    layered = solve(short, "heuristic", quick)
    assert type(layered.plan) is PLAN_KINDS["layered"].plan_type
    assert layered.kind_reason.startswith("--kind auto: solved every kind (layered ")  # s = 64: no sequence plan
    assert layered.kind_reason.endswith("only layered plans were found") and layered.kinds_tried["sequence"] is None
    sequence = solve(long, "seq-uniform", quick)
    assert type(sequence.plan) is PLAN_KINDS["sequence"].plan_type
    assert sequence.kind_reason == "only sequence plans have solver 'seq-uniform'"
    assert choose_kind(long, "auto", "heuristic") == (
        "sequence", f"--kind auto: seq_len {long.training.seq_len:,} ≥ {LONG_CONTEXT_TOKENS:,} tokens is long "
                    f"context; pass --kind layered for a layered plan")
    assert choose_kind(long, "auto", "symmetric") == ("layered", "only layered plans have solver 'symmetric'")
    assert solve(short, "heuristic", quick, kind="layered").kind_reason == ""


def test_the_headline_figures_are_evaluates_for_both_kinds():
    """`compare`'s rows price a plan with `headline`: T, tokens/s, MFU, rent and cost per million
    tokens must be `evaluate`'s own, to the bit, for a plan of either kind (priced and not)."""
    from instances.random_priced import random_priced
    from planner.io import load_problem
    from planner.kinds import evaluate, headline
    from solvers.common import SolverOptions
    from solvers.registry import solve as solve_kind

    problems = [load_problem(name) for name in ("demo-asym", "longctx-h100-a100-llama3-8b-64k")]
    problems += [random_priced(seed) for seed in range(4)]
    seen = set()
    for problem in problems:
        for kind in ("layered", "sequence"):
            plan = solve_kind(problem, "heuristic", SolverOptions(time_limit_s=2), kind=kind).plan
            if plan is None:
                continue
            est, top = evaluate(problem, plan), headline(problem, plan)
            for name in ("iteration_s", "tokens_per_s", "mfu", "rent_per_hour", "cost_per_mtok"):
                assert getattr(top, name) == getattr(est, name), (problem.name, kind, name)
            seen.add((kind, est.rent_per_hour is not None))
    assert seen == {(kind, priced) for kind in ("layered", "sequence") for priced in (False, True)}, seen
