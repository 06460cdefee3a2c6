"""The shape of the code: layers that point one way, short functions.

The import graph is read from the source (every `import`, at module level or deferred inside
a function), so a cycle hidden behind a deferred import is still a cycle; so are the modules
a string names for `importlib` (the solver registry's "module:function" entries, a runtime
kind's worker module), as edges of the module that holds the string."""

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


def _named_in_string(node: ast.AST, known: set[str]) -> list[str]:
    """The project module a string constant names for `importlib`: "module:function" (the
    solver registry) or a whole dotted module name (a runtime kind's worker)."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return []
    name = node.value.split(":")[0] if node.value.count(":") == 1 else node.value
    return [name] if "." in name and name in known else []


def _run_as_main(tree: ast.AST) -> set[int]:
    """The string nodes that follow "-m" in a command list: a module a new interpreter runs
    as its main (a process this module starts), not one it imports."""
    return {id(after) for node in ast.walk(tree) if isinstance(node, (ast.List, ast.Tuple))
            for before, after in zip(node.elts, node.elts[1:])
            if isinstance(before, ast.Constant) and before.value == "-m"}


def module_edges(name: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules one module's source imports or names in an importlib string."""
    tree = ast.parse(source)
    mains = _run_as_main(tree)
    edges = {m for node in ast.walk(tree)
             for m in _imported(node, name, is_package, known)
             + ([] if id(node) in mains else _named_in_string(node, known))}
    return edges - {name}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: module_edges(name, path.read_text(), path.name == "__init__.py", known)
            for name, path in modules.items()}


def reachable(graph: dict[str, set[str]], roots: list[str]) -> set[str]:
    """Every module the roots reach, transitively (the roots excluded unless reached)."""
    seen, todo = set(), [e for r in roots for e in graph[r]]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


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


def test_registry_strings_are_edges_and_a_planted_string_cycle_is_found():
    """A "module:function" string is an edge: a registry naming a solver that imports the
    registry back is a cycle, though no import statement closes it."""
    known = {"pkg", "pkg.registry", "pkg.solver", "pkg.other"}
    registry = ('import importlib\nSOLVERS = {"s": "pkg.solver:solve", "doc": "not pkg.other"}\n'
                'MAIN = ["python", "-m", "pkg.other"]\n')  # a process started, not an import
    graph = {"pkg": set(), "pkg.other": set(),
             "pkg.registry": module_edges("pkg.registry", registry, False, known),
             "pkg.solver": module_edges("pkg.solver", "from pkg import registry\n", False, known)}
    assert graph["pkg.registry"] == {"pkg.solver"}  # the entry, not the prose
    assert find_cycle(graph) == ["pkg.registry", "pkg.solver", "pkg.registry"]
    real = import_graph()
    assert "solvers.layered.exact.brute" in real["solvers.registry"]  # the real registry's strings
    assert "runtime.sequence.worker" in real["runtime.sequence"]  # a runtime kind's worker string


EXACT_PACKAGES = ("solvers.layered.exact", "solvers.sequence.exact")


@pytest.mark.parametrize("heuristic", ["solvers.layered.heuristic", "solvers.sequence.heuristic"])
def test_heuristics_never_reach_the_exact_solvers(heuristic):
    """The heuristics import nothing of the exact packages, even through the registry's
    strings: "the heuristic, then the exact refinement" is a solver above both
    (solvers/layered/composed.py), and the exact solvers take their warm start as a function."""
    graph = import_graph()
    roots = [m for m in graph if m == heuristic or m.startswith(heuristic + ".")]
    reached = reachable(graph, roots)
    assert not sorted(m for m in reached if m.startswith(EXACT_PACKAGES) or m == "solvers.registry")


@pytest.mark.parametrize("exact", EXACT_PACKAGES)
def test_exact_solvers_never_reach_the_heuristics(exact):
    graph = import_graph()
    reached = reachable(graph, [m for m in graph if m == exact or m.startswith(exact + ".")])
    assert not sorted(m for m in reached if ".heuristic" in m or m == "solvers.registry")


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
    """One layer owns every send, receive, collective and group (docs/solvers.md §6): no other
    module imports torch.distributed (or anything under it) — bar torchrun's agent
    (`torch.distributed.run`), which runtime.launch.torchrun wraps: it starts processes and
    serves the rendezvous store, and makes no send, collective or group. The communicator's
    chunked exchanges (`runtime.communication.duplex`) are part of it: nothing else imports
    them."""
    users = sorted(name for name, path in project_modules().items()
                   if any(n == "torch.distributed" or n.startswith("torch.distributed.")
                          for n in _external_imports(path)))
    assert users == ["runtime.communication.communicator", "runtime.communication.duplex", "runtime.launch.torchrun"]
    graph = import_graph()
    assert sorted(name for name, edges in graph.items() if "runtime.communication.duplex" in edges) == [
        "runtime.communication.communicator"]


def test_every_cp_sat_solver_is_made_by_cp_solver():
    """CP-SAT catches SIGINT by default and on its way out leaves SIGINT at the operating system's
    default, whatever it was: a Ctrl-C then kills the command with nothing printed, and in a
    test run whose SIGINT was ignored (a CI job started in the background) it un-ignored it in
    one pytest worker and not the other. `solvers.cp_sat.cp_solver` turns that off; nothing else,
    tests and benchmarks included, makes a CpSolver."""
    makers = sorted(str(path.relative_to(ROOT)) for folder in ("solvers", "planner", "hexiscale", "runtime",
                                                              "tests", "benchmarks")
                    for path in (ROOT / folder).rglob("*.py")
                    if "CpSolver(" in path.read_text() and path.name != "test_architecture.py")
    assert makers == ["solvers/cp_sat.py"]


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
