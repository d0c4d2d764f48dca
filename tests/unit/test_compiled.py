"""The compiled hot path (hatch_build.py, relay/compiled.py).

`RELAY_MYPYC=1 pip install .` builds a wheel whose HOT_PATH modules are C
extensions made by mypyc. .ci/run builds that wheel, installs it in a second
virtual environment and runs the default suite against it with
RELAY_EXPECT_COMPILED=1: then the suite's own imports must be the compiled
modules, or the run would test the pure ones twice and say nothing.
"""

from __future__ import annotations

import importlib
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from relay.compiled import HOT_PATH, build_name, compiled_modules, module_file

from helpers import relay_cli

EXPECT_COMPILED = os.environ.get("RELAY_EXPECT_COMPILED") == "1"


def test_every_hot_path_module_exists() -> None:
    for name in HOT_PATH:
        source = module_file(name).with_suffix(".py")
        assert source.is_file(), f"{name} is in HOT_PATH but {source} does not exist"


def test_a_module_counts_as_compiled_by_its_extension_file(tmp_path: Path) -> None:
    package = tmp_path / "relay"
    for name in HOT_PATH:
        source = module_file(name, package).with_suffix(".py")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("")
    assert compiled_modules(package) == []
    writer = package / "store" / "sqlite" / f"writer{EXTENSION_SUFFIXES[0]}"
    writer.write_bytes(b"")
    assert compiled_modules(package) == ["relay.store.sqlite.writer"]


@pytest.mark.skipif(EXPECT_COMPILED, reason="the compiled build's run (RELAY_EXPECT_COMPILED)")
def test_a_pure_checkout_says_so() -> None:
    # The README's test command installs the checkout editable: never compiled.
    assert compiled_modules() == []
    assert build_name() == "pure Python"


@pytest.mark.skipif(not EXPECT_COMPILED, reason="only in .ci/run's run against the compiled wheel")
def test_the_suite_runs_the_compiled_modules() -> None:
    for name in HOT_PATH:
        module = importlib.import_module(name)
        origin = str(module.__file__)
        assert origin.endswith(tuple(EXTENSION_SUFFIXES)), f"{name} was imported from {origin}"
    assert compiled_modules() == list(HOT_PATH)
    # relay as the tests start it in a process of their own (helpers.RELAY).
    version = relay_cli("--version").stdout
    assert version.strip().endswith("hot path compiled (mypyc)")
