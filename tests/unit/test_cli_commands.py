"""The command table: each subcommand is found in its module, and only the
module of the command run is imported (`relay serve` held every other
command's code for as long as it ran: its idle memory went past 50 MiB)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from relay.cli import COMMANDS, parser
from relay.cli.check import unused_targets
from relay.loader import parse_config


def registered(root: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand the parser knows, with its handler's module."""
    [commands] = [
        action
        for action in root._subparsers._group_actions  # type: ignore[union-attr]
        if isinstance(action, argparse._SubParsersAction)
    ]
    return {name: sub.get_default("handler").__module__ for name, sub in commands.choices.items()}


def test_every_command_is_listed_with_the_module_that_registers_it() -> None:
    found = registered(parser())
    assert list(found) == list(COMMANDS)  # help lists them in this order
    assert found == {name: f"relay.cli.{module}" for name, module in COMMANDS.items()}


def test_a_command_run_imports_its_own_module_alone() -> None:
    for name, module in COMMANDS.items():
        if name == "completion":
            continue  # it writes the whole tree
        assert set(registered(parser(name)).values()) == {f"relay.cli.{module}"}
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from relay.cli import parser; parser('serve');"
            " print(sorted(m for m in sys.modules if m.startswith('relay.cli.')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for other in set(COMMANDS.values()) - {"serve", "completion"}:
        assert f"'relay.cli.{other}'" not in loaded, loaded


def test_serve_imports_nothing_only_a_mistake_or_a_named_zone_needs() -> None:
    # Each is held for as long as relay runs: difflib (a fifth of a MiB) only
    # says "did you mean ...?"; zoneinfo with its sysconfig (a quarter) only
    # reads a zone the config names; getpass only names an operator.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from relay.cli import parser; parser('serve'); import relay.app;"
            " print(sorted(m for m in ('difflib', 'zoneinfo', 'getpass') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "[]"


def test_check_counts_the_alerts_target_as_used(tmp_path: Path) -> None:
    # relay check called the target that [alerts] sends to "not used by any route".
    config = parse_config(
        {
            "targets": {
                "crm": {"type": "file", "path": "crm.jsonl"},
                "manager_mail": {"type": "file", "path": "alerts.jsonl"},
                "spare": {"type": "file", "path": "spare.jsonl"},
            },
            "routes": {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
            "alerts": {"target": "manager_mail"},
        },
        {},
        base=tmp_path,
    )
    assert unused_targets(config) == ["spare"]
