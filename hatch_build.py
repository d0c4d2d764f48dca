"""Build hook: the wheel with relay's hot path compiled by mypyc, when asked.

    RELAY_MYPYC=1 pip install .        # or: pip wheel ., scripts/build-single-file

The modules in `relay.compiled.HOT_PATH` (ingress's request path and the
group-commit writer's batch building: plain typed Python, `mypy --strict`
clean) are compiled to C extensions, as black and mypy ship themselves. Each .py stays in
the wheel beside its .so; Python imports the .so first. Without RELAY_MYPYC
the wheel is pure Python and behaves the same, only slower: mypyc, setuptools
and a C compiler are needed only for the compiled build, which fails loudly
rather than falling back when asked for and impossible.

Editable installs are never compiled (the sources are what is edited).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import shutil
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# Pinned with the mypy the test extras pin: the compiler is the type checker.
_COMPILER = ["mypy==2.4.1", "setuptools>=69"]
# mypyc type-checks the package as `mypy --strict` does (the [tool.mypy]
# settings), so the build needs what that reads beyond relay's own
# dependencies: asyncpg's stubs and cryptography (the ed25519 extra).
_TYPES = ["asyncpg-stubs>=0.29", "cryptography>=42"]
_GROUP = "relay_native"  # the shared library mypyc's runtime and the modules go in


def compile_requested() -> bool:
    return os.environ.get("RELAY_MYPYC", "").strip() not in ("", "0")


class MypycHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        if not compile_requested():
            return []
        return [*_COMPILER, *_TYPES, *self.metadata.core.dependencies]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable" or not compile_requested():
            return
        root = Path(self.root)
        modules = _hot_path_sources(root)
        work = root / "build" / "mypyc"
        shutil.rmtree(work, ignore_errors=True)
        built = _compile(root, modules, work)
        for path in built:
            build_data["force_include"][str(path)] = str(path.relative_to(work / "lib"))
        build_data["pure_python"] = False
        build_data["infer_tag"] = True  # cp311-cp311-<platform>: the .so is for this Python


def _hot_path_sources(root: Path) -> list[str]:
    """The sources of relay.compiled.HOT_PATH, relative to root (relay/ingress/http1.py),
    read without importing relay (whose dependencies a build environment does
    not have)."""
    namespace = runpy.run_path(str(root / "relay" / "compiled.py"))
    module_file = namespace["module_file"]
    return [
        str(module_file(name, Path("relay")).with_suffix(".py")) for name in namespace["HOT_PATH"]
    ]


def _compile(root: Path, modules: list[str], work: Path) -> list[Path]:
    """Compile `modules` (paths relative to root) into work/lib; the files built."""
    # Imported only when compiling: a pure build needs neither.
    from mypyc.build import mypycify
    from setuptools import Distribution

    # mypycify names the extensions after the paths as given, relative to the
    # current directory, and reads the [tool.mypy] settings found there.
    with contextlib.chdir(root):
        extensions = mypycify(modules, opt_level="3", target_dir=str(work / "c"), group_name=_GROUP)
        # build_ext alone: setup() would also read pyproject.toml as setuptools'
        # own project table, which it is not.
        distribution = Distribution({"name": "relay", "ext_modules": extensions})
        command = distribution.get_command_obj("build_ext")
        command.build_lib = str(work / "lib")
        command.build_temp = str(work / "temp")
        command.ensure_finalized()
        command.run()
    built = sorted(path for path in (work / "lib").rglob("*") if path.is_file())
    expected = {Path(module).with_suffix("") for module in modules}
    # relay/http1.cpython-311-x86_64-linux-gnu.so: two suffixes to take off.
    names = {path.relative_to(work / "lib").with_suffix("").with_suffix("") for path in built}
    missing = expected - names
    if missing:
        raise RuntimeError(f"mypyc built no extension for {sorted(map(str, missing))}")
    return built
