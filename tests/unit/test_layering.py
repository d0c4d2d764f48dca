"""The import graph of relay/ has no cycle: read from the source, as a
maintainer's tool would (imports at the top and inside functions; those under
TYPE_CHECKING are for types only and run nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


class _Imports(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: list[str] = []

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.names += [alias.name for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            self.names.append(node.module)
            self.names += [f"{node.module}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    files = {_module(path): path for path in (ROOT / "relay").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        targets = set()
        for imported in visitor.names:
            if imported not in files or imported == name:
                continue
            targets.add(imported)
            # Importing a.b.c runs the packages a.b (unless it is the importer's own).
            parts = imported.split(".")
            for end in range(2, len(parts)):
                package = ".".join(parts[:end])
                if package in files and not name.startswith(package + "."):
                    targets.add(package)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_module_of_relay_imports_itself_in_a_circle() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the whole package was read
    assert cycles(graph) == []
