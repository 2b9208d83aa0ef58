"""The package's shape, checked: each module does one thing and stays readable.

Fails on a module under metalforge/ over 800 lines, a function over 80 lines, an import circle
between modules (imports under TYPE_CHECKING and inside functions count: a circle is a design
fault whether or not Python happens to resolve it) and a class name defined in two modules.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "metalforge"
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _imported(name: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The metalforge modules an import statement of module `name` reads."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in MODULES}
    base = node.module or ""
    if node.level:
        package = name.split(".") if MODULES[name].name == "__init__.py" else name.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    found = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.add(sub if sub in MODULES else base)
    return found & set(MODULES)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _imported(name, node) - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in MODULES:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_modules_are_short():
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_functions_are_short():
    long = [f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree in TREES.items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_import_circles():
    circles = _circles(_graph())
    assert not circles, f"modules that import each other (directly or around a circle): {circles}"


def test_one_module_per_class_name():
    where = defaultdict(list)
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(name)
    twice = {c: ms for c, ms in where.items() if len(ms) > 1}
    assert not twice, f"class names defined in several modules: {twice}"


def test_the_checks_can_fail():
    """The circle finder finds a planted circle, and the import reader resolves relative
    imports (the checks above would pass vacuously otherwise)."""
    assert _circles({**{m: set() for m in MODULES},
                     "metalforge.ir": {"metalforge.graph"},
                     "metalforge.graph": {"metalforge.ir"}}) == [["metalforge.graph",
                                                                  "metalforge.ir"]]
    assert "metalforge.graph" in _graph()["metalforge.ir"] | _graph()["metalforge.reference"]
