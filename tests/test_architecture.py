"""The shape of the code: layers that point one way, short functions.

The import graph is read from the source (every `import`, at module level or deferred inside
a function), so a cycle hidden behind a deferred import is still a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "solvers", "runtime", "hexiscale", "instances")
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    """Project modules one import statement loads (a `from X import name` loads X.name when
    that is a module, else X itself)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative import
        here = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
    out = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    if len(out) < len(node.names) and base in known:
        out.append(base)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = {m for node in ast.walk(tree) for m in _imported(node, name, is_package, known)}
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a path a → … → a, or None (iterative DFS)."""
    colour = dict.fromkeys(graph, 0)  # 0 unseen, 1 on the stack, 2 done
    for root in sorted(graph):
        if colour[root]:
            continue
        stack, path = [(root, iter(sorted(graph[root])))], [root]
        colour[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return path[path.index(child):] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_among_project_modules():
    graph = import_graph()
    assert len(graph) > 50 and graph["planner.layered.pricing"]  # the graph was really read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_planner_imports_nothing_above_it():
    for module, edges in import_graph().items():
        if module.startswith("planner"):
            above = sorted(e for e in edges if not e.startswith("planner"))
            assert not above, f"{module} imports {above}"


def _external_imports(path: Path) -> set[str]:
    """Every module name an import statement of the file names (dotted, as written)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_only_the_communicator_touches_torch_distributed():
    """One layer owns every send, receive, collective and group (DESIGN.md §6): no other
    module imports torch.distributed (or anything under it)."""
    users = sorted(name for name, path in project_modules().items()
                   if any(n == "torch.distributed" or n.startswith("torch.distributed.")
                          for n in _external_imports(path)))
    assert users == ["runtime.communication.communicator"]


def _long_functions() -> list[str]:
    out = []
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{name}.{node.name}: {lines} lines")
    return out


def test_no_function_over_60_lines():
    assert not _long_functions()


@pytest.mark.parametrize("kind", ["layered", "sequence"])
def test_each_plan_kind_has_its_folders(kind):
    """A plan kind's types and cost live in planner/<kind>/, its solvers in solvers/<kind>/."""
    from planner.kinds import PLAN_KINDS

    assert kind in PLAN_KINDS
    assert (ROOT / "planner" / kind / "__init__.py").exists()
    assert (ROOT / "solvers" / kind / "__init__.py").exists()
