"""The house has no circles: the import graph of d2lattn's modules, read from the source
(``ast``), counting imports inside functions too, has no cycle."""

import ast
from pathlib import Path

import d2lattn

PACKAGE = Path(d2lattn.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _imported(node: ast.AST) -> list:
    """The d2lattn modules one import statement names (relative or absolute)."""
    if isinstance(node, ast.Import):
        return [a.name.split(".")[1] for a in node.names if a.name.startswith("d2lattn.")]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level == 1 or node.module == "d2lattn":
        if node.module and node.module != "d2lattn":  # from .x import y
            return [node.module.split(".")[0]]
        return [a.name for a in node.names]  # from . import x / from d2lattn import x
    if node.module and node.module.startswith("d2lattn."):
        return [node.module.split(".")[1]]
    return []


def import_graph() -> dict:
    """``{module: {modules it imports anywhere in its source}}`` for d2lattn's modules."""
    graph = {}
    for name in MODULES:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        graph[name] = {m for node in ast.walk(tree) for m in _imported(node) if m in MODULES}
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components with more than one module, or a module importing itself."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_circles():
    """The check can fail: a lazy import inside a function closes a circle."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("def f():\n    from .interactive import grid_parts\n")
    assert [m for node in ast.walk(tree) for m in _imported(node)] == ["interactive"]


def test_d2lattn_imports_have_no_cycles():
    graph = import_graph()
    assert len(graph) >= 25 and graph["multihead"] >= {"flash", "heads", "kvcache"}
    assert cycles(graph) == []


def test_the_lowest_rooms_import_nothing_from_d2lattn():
    graph = import_graph()
    assert graph["_checks"] == set() and graph["heads"] == set()
    assert graph["kvcache"] == {"_checks"}
