"""The import graph of relay/ has no cycle and no upward edge, module by
module and package by package: read from the source, as a maintainer's tool
would. Every import counts: at the top, inside functions, and under
TYPE_CHECKING (a type names its layer as surely as a call does). So does a
module named in a string by a module that imports by name (the registry's
built-in kinds): a string must not hide an edge."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# relay's packages as layers, the lowest first: a module imports from its
# own package or from a lower layer, never from a higher one, nor from
# another package of its own layer (ingress and background, sources and
# targets, know nothing of each other). Each package is in one layer, whole.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("relay", "relay.compiled", "relay.core"),
    ("relay.templates",),
    ("relay.config",),
    ("relay.kinds",),
    ("relay.sources", "relay.targets"),
    ("relay.loader",),
    ("relay.store",),
    ("relay.delivery",),
    ("relay.ops",),
    ("relay.ingress", "relay.background"),
    ("relay.admin",),
    ("relay.app",),
    ("relay.cli",),
    ("relay.__main__",),
)


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


class _Imports(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: list[str] = []
        self.strings: list[str] = []
        self.imports_by_name = False

    def visit_Import(self, node: ast.Import) -> None:
        self.names += [alias.name for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            self.names.append(node.module)
            self.names += [f"{node.module}.{alias.name}" for alias in node.names]

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value.startswith("relay."):
            self.strings.append(node.value)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("import_module", "__import__"):
            self.imports_by_name = True
        self.generic_visit(node)


def import_graph() -> dict[str, set[str]]:
    """Each module's imports; a copy each call, of one reading of the source."""
    return {name: set(targets) for name, targets in _read_graph().items()}


@functools.cache
def _read_graph() -> dict[str, frozenset[str]]:
    files = {_module(path): path for path in (ROOT / "relay").rglob("*.py")}
    graph: dict[str, frozenset[str]] = {}
    for name, path in files.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        named = visitor.names + (visitor.strings if visitor.imports_by_name else [])
        targets = set()
        for imported in named:
            if imported not in files or imported == name:
                continue
            targets.add(imported)
            # Importing a.b.c runs the packages a.b (unless it is the importer's own).
            parts = imported.split(".")
            for end in range(2, len(parts)):
                package = ".".join(parts[:end])
                if package in files and not name.startswith(package + "."):
                    targets.add(package)
        graph[name] = frozenset(targets)
    return graph


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same edges between the areas of LAYERS (relay.store, relay.loader...)."""
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        edges = packages.setdefault(area(module)[1], set())
        edges.update(area(target)[1] for target in imported)
        edges.discard(area(module)[1])
    return packages


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


def test_no_package_of_relay_imports_itself_in_a_circle() -> None:
    assert cycles(package_graph(import_graph())) == []


def test_the_package_check_sees_a_circle_through_a_string() -> None:
    # A registry naming a kind's module, and the kind typing against the registry.
    registry = ROOT / "relay" / "loader" / "registry.py"
    visitor = _Imports()
    visitor.visit(ast.parse(registry.read_text(encoding="utf-8")))
    assert "relay.targets.http" in visitor.strings
    assert visitor.imports_by_name
    graph = {
        "relay.loader.registry": {"relay.targets.http"},
        "relay.targets.http": {"relay.loader.registry"},
    }
    assert cycles(package_graph(graph)) == [["relay.loader", "relay.targets"]]


def test_no_package_loads_its_names_lazily() -> None:
    # PEP 562 shims (a package __init__ with __getattr__) hid a circle of
    # packages; the folders now say what imports what.
    shims = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "relay").rglob("__init__.py")
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    ]
    assert shims == []


def area(module: str) -> tuple[int, str]:
    """The layer (its index) and the area that `module` belongs to."""
    found = [
        (len(name), layer, name)
        for layer, names in enumerate(LAYERS)
        for name in names
        if module == name or module.startswith(name + ".")
    ]
    _, layer, name = max(found)
    return layer, name


def _package(name: str) -> str:
    return ".".join(name.split(".")[:2])


def upward(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imported in sorted(graph.items()):
        layer, name = area(module)
        for target in sorted(imported):
            target_layer, target_name = area(target)
            sideways = target_layer == layer and _package(target_name) != _package(name)
            if target_layer > layer or sideways:
                wrong.append(f"{module} ({name}) imports {target} ({target_name})")
    return wrong


def test_every_module_is_in_a_package_of_the_pipeline() -> None:
    # The root holds the package itself, the entry point, the wiring (app)
    # and the build's list of compiled modules; everything else is in a stage.
    loose = [name for name in import_graph() if area(name)[1] == "relay" and name != "relay"]
    assert loose == []


def test_no_module_imports_upward_or_sideways() -> None:
    assert upward(import_graph()) == []


def test_the_layering_check_sees_an_upward_import() -> None:
    # The store importing the scheduler, and ingress the indexer beside it.
    graph = {
        "relay.store.base": {"relay.delivery.scheduler"},
        "relay.ingress.listener": {"relay.background.indexer", "relay.core.payload"},
    }
    assert upward(graph) == [
        "relay.ingress.listener (relay.ingress) imports relay.background.indexer"
        " (relay.background)",
        "relay.store.base (relay.store) imports relay.delivery.scheduler (relay.delivery)",
    ]


# The store's backends, each a package; what both share sits beside them.
BACKENDS = ("relay.store.sqlite", "relay.store.postgres")
# The only shared modules that know the backends: they pick one by the config.
CHOOSERS = ("relay.store", "relay.store.backends")


def across_backends(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one backend's package into another's, and from the
    shared store modules into a backend (but the choosers')."""
    wrong = []
    for module, imported in sorted(graph.items()):
        if not module.startswith("relay.store"):
            continue
        own = next((b for b in BACKENDS if module == b or module.startswith(b + ".")), None)
        for target in sorted(imported):
            backend = next((b for b in BACKENDS if target == b or target.startswith(b + ".")), None)
            if backend is None or backend == own or (own is None and module in CHOOSERS):
                continue
            wrong.append(f"{module} imports {target}")
    return wrong


def test_a_backend_imports_no_other_and_the_shared_store_neither() -> None:
    assert across_backends(import_graph()) == []


def test_the_backend_check_sees_a_sideways_import() -> None:
    graph = {
        "relay.store.postgres.copy": {"relay.store.sqlite.schema", "relay.store.dialect"},
        "relay.store.reads": {"relay.store.sqlite.connection"},
        "relay.store.backends": {"relay.store.postgres"},
        "relay.store.sqlite.queue": {"relay.store.sqlite.connection"},
    }
    assert across_backends(graph) == [
        "relay.store.postgres.copy imports relay.store.sqlite.schema",
        "relay.store.reads imports relay.store.sqlite.connection",
    ]
