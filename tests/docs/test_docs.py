"""Docs that cannot drift: every config key and every command is documented."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relay.cli import parser
from relay.config import AdminConfig, ServerConfig
from relay.kinds.source import REJECT_REASONS
from relay.loader import parse_config
from relay.loader.registry import source_kinds, target_kinds
from relay.ops.metrics import INGRESS_RESULTS, Metrics
from relay.ops.systemd import BACKLOG, LISTENERS

from activation import SocketUnit, service_sockets
from kitchen_sink import TARGETS, every_key

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
EXAMPLE = (ROOT / "relay.example.toml").read_text(encoding="utf-8")


def test_every_config_key_is_in_the_reference() -> None:
    keys = every_key()
    assert len(keys) > 60  # the kitchen sink really covers the loader
    missing = sorted(key for key in keys if f"`{key}`" not in REFERENCE)
    assert missing == []


def test_every_kind_is_in_the_kitchen_sink_and_the_reference() -> None:
    # Derived from the registries: a kind registered without its docs (or
    # without a table here, so that its keys are never asked for) fails.
    assert {table["type"] for table in TARGETS.values()} == set(target_kinds())
    assert [name for name in target_kinds() if f'### `type = "{name}"`' not in REFERENCE] == []
    assert [name for name in source_kinds() if f"| `{name}` |" not in REFERENCE] == []


def test_every_config_key_is_in_the_example_config() -> None:
    missing = sorted(
        key
        for key in every_key()
        if not re.search(
            rf"(^|[\s#{{,]){re.escape(key.rsplit('.', 1)[-1])}\s*=", EXAMPLE, re.MULTILINE
        )
    )
    assert missing == []


def commands() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(
        action for action in parser()._actions if isinstance(action, argparse._SubParsersAction)
    )
    return dict(subparsers.choices)


def test_every_command_and_option_is_in_the_reference() -> None:
    found = commands()
    assert {
        "serve",
        "check",
        "events",
        "show",
        "retry",
        "requeue",
        "stats",
        "purge",
        "backup",
        "init",
        "render",
        "pause",
        "resume",
        "rejections",
    } <= set(found)
    for name, command in found.items():
        section = re.search(
            rf"^### [^\n]*`relay {name}\b[^\n]*\n.*?(?=^### |\Z)",
            REFERENCE,
            re.MULTILINE | re.DOTALL,
        )
        assert section is not None, f"relay {name} has no section"
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    if option == "--config":
                        continue  # documented once, for every command
                    assert option in section.group(0), f"relay {name} {option} undocumented"


def test_every_command_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in commands():
        assert f"relay {name}" in readme, f"relay {name} missing from the README"


UNITS = ("relay.service", "relay.socket", "relay-admin.socket")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_units_verify(tmp_path: Path) -> None:
    # The relay beside this interpreter: PATH may not include the venv's bin.
    relay = shutil.which("relay", path=str(Path(sys.executable).parent))
    assert relay is not None
    # verify checks that ExecStart exists: point it at this environment's relay.
    for name in UNITS:
        text = (ROOT / "systemd" / name).read_text()
        (tmp_path / name).write_text(text.replace("/usr/local/bin/relay", relay))
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / name) for name in UNITS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    unit = (ROOT / "systemd" / "relay.service").read_text()
    for directive in (
        "Type=notify",
        "WatchdogSec=",
        "ExecReload=",
        "Restart=on-failure",
        "StateDirectory=relay",
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "RestrictAddressFamilies=",
        "SystemCallFilter=@system-service",
        "CapabilityBoundingSet=",
        "EnvironmentFile=",
        "LoadCredential=",
        "TimeoutStopSec=",
        # relay.pyz unpacks into $SHIV_ROOT: under the unit HOME=/ is read-only.
        "CacheDirectory=relay",
        "Environment=SHIV_ROOT=/var/cache/relay",
        # Socket activation: the listeners are systemd's, and stopping a socket stops relay.
        "Sockets=relay.socket relay-admin.socket",
        "Requires=relay.socket relay-admin.socket",
    ):
        assert directive in unit
    # A stop takes server.shutdown_timeout at most, then closes the database.
    stop = int(re.search(r"^TimeoutStopSec=(\d+)s", unit, re.MULTILINE).group(1))
    assert stop >= ServerConfig().shutdown_timeout + 10


def test_the_socket_units_are_the_ones_relay_takes() -> None:
    """Each socket unit names its descriptor as relay takes it, queues as many
    connections as relay's own listen() asks for (it calls listen() again on
    the socket it is given), and listens where the config's defaults do."""
    sockets = [SocketUnit.read(ROOT / "systemd" / name) for name in UNITS[1:]]
    assert [unit.fd_name for unit in sockets] == list(LISTENERS)
    assert all(unit.backlog == BACKLOG for unit in sockets)
    assert [unit.listen for unit in sockets] == [
        str(ServerConfig().listen),
        str(AdminConfig().listen),
    ]
    assert [unit.name for unit in service_sockets()] == list(UNITS[1:])


@pytest.mark.parametrize("name", UNITS)
def test_every_directive_is_explained(name: str) -> None:
    lines = (ROOT / "systemd" / name).read_text().splitlines()
    for index, line in enumerate(lines):
        if "=" in line and not line.startswith(("#", "[")) and line.strip():
            before = lines[max(0, index - 6) : index]
            assert any(previous.startswith("#") for previous in before), f"unexplained: {line}"


def test_every_ingest_result_and_rejection_reason_is_documented_and_exported_at_0() -> None:
    # operate.md said all were exported from the start; 4 of 12 results were,
    # and no rejection reason until the first rejection.
    operate = (ROOT / "docs" / "operate.md").read_text(encoding="utf-8")
    results = re.search(
        r"\| `relay_events_received_total` \| counter \| `route`, `result` \(([^)]*)\)", operate
    )
    assert results is not None
    listed = re.findall(r"\b[a-z_]+\b", results.group(1).split(";")[0])
    assert listed == list(INGRESS_RESULTS)
    reasons = re.search(
        r"\| `relay_rejected_total` \| counter \| `route`, `reason` \(([^)]*)\)", operate
    )
    assert reasons is not None
    assert [r.strip() for r in reasons.group(1).split(",")] == list(REJECT_REASONS)
    metrics = Metrics()
    config = {
        "targets": {"crm": {"type": "file", "path": "crm.jsonl"}},
        "routes": {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
    }
    metrics.configure(parse_config(config, {}, base=ROOT))
    text = metrics.render().decode()
    for result in INGRESS_RESULTS:
        assert f'result="{result}"' in text
    for reason in REJECT_REASONS:
        assert f'relay_rejected_total{{reason="{reason}"' in text


def test_every_rejection_a_source_gives_is_in_the_vocabulary() -> None:
    said = set()
    for path in (ROOT / "relay" / "sources").glob("*.py"):
        said |= set(re.findall(r'Reject\(\s*"([a-z_]+)"', path.read_text(encoding="utf-8")))
    assert said
    assert said <= set(REJECT_REASONS), said - set(REJECT_REASONS)
