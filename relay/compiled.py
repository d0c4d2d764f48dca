"""Which of relay's modules may run compiled, and which do.

`RELAY_MYPYC=1 pip install .` compiles HOT_PATH with mypyc (hatch_build.py
reads the list from this file): the request path of ingress and the
group-commit writer's batch building, plain typed Python that mypyc turns into
C extensions beside the .py files, which Python then imports first. A wheel
built without it is pure Python and behaves the same.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

HOT_PATH = (
    "relay.ingress.http1",
    "relay.ingress.guard",
    "relay.ingress.listener",
    "relay.core.incoming",
    "relay.ingress.plan",
    "relay.core.exact",
    "relay.core.canonical",
    "relay.store.accept",
    "relay.store.sqlite.accept",
    "relay.store.sqlite.writer",
)

_PACKAGE = Path(__file__).resolve().parent


def module_file(name: str, package: Path = _PACKAGE) -> Path:
    """Where module `name` (relay.store.sqlite.writer) lives in `package` (the relay
    folder), without a suffix: writer.py beside it is the source, writer
    plus an extension suffix the compiled module."""
    return package.joinpath(*name.split(".")[1:])


def compiled_modules(package: Path = _PACKAGE) -> list[str]:
    """The HOT_PATH modules an import would load compiled from `package` (the
    relay folder). Found by file, not by import: `relay --version` must not
    load the store or the HTTP machinery."""
    compiled = []
    for name in HOT_PATH:
        base = module_file(name, package)
        if any(base.with_name(base.name + suffix).is_file() for suffix in EXTENSION_SUFFIXES):
            compiled.append(name)
    return compiled


def build_name() -> str:
    """For `relay --version`: how the hot path runs here."""
    compiled = compiled_modules()
    if not compiled:
        return "pure Python"
    if len(compiled) == len(HOT_PATH):
        return "hot path compiled (mypyc)"
    return f"hot path partly compiled ({len(compiled)} of {len(HOT_PATH)} modules)"
