"""The import graph of relay/ has no cycle and no upward edge: read from the
source, as a maintainer's tool would (imports at the top and inside functions;
those under TYPE_CHECKING are for types only and run nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# relay's packages as layers, the lowest first. A module belongs to the longest
# name here that is it or a package holding it (a package's __init__ is the
# package's name). A module imports from its own area or from a lower layer:
# never from a higher one, nor from another package of its own layer (ingress and
# background, sources and targets, know nothing of each other). The config and
# the kinds are split: their primitives (reading a TOML section, what a kind
# declares) sit below the kinds' modules, the parsing that knows every kind
# above them; both packages' __init__ load the upper half only when used.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("relay", "relay.compiled", "relay.core"),
    ("relay.templates",),
    ("relay.config",),
    ("relay.kinds",),
    ("relay.sources", "relay.targets"),
    ("relay.kinds.registry",),
    ("relay.config.load", "relay.config.targets", "relay.config.operator"),
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
