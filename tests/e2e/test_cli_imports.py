"""Database commands import only what they use: no daemon machinery to start.

Every `relay` command once imported aiohttp.web, Jinja2 and prometheus
through the daemon's wiring (~0.75 s before `relay events` printed a line).
A timer would be flaky on a shared machine; what makes the start slow is
which modules are loaded, and that is checked exactly: each command runs in
a fresh interpreter and reports what it imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relay.core.payload import Payload
from relay.store import NewDelivery, NewEvent, SqliteStore

from helpers import write_config

# The daemon's (and `relay check`'s, `relay render`'s) machinery.
HEAVY = (
    "aiohttp",
    "aiohttp.web",
    "jinja2",
    "relay.app",
    "relay.templates",
    "relay.delivery.scheduler",
)

# Loaded only when the config names what needs them: PostgreSQL's driver for a
# [storage] url, the mail client when a target sends mail, the HTTP client
# when a target starts to send (a target type's module is read with the config).
DRIVERS = ("asyncpg", "aiosmtplib", "relay.targets.outbound.client")

# Runs one command as `relay` would, then writes what it imported to argv[1].
RUN_AND_REPORT = """
import json, sys
from pathlib import Path
from relay.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exit:  # argparse's --version
    code = exit.code
Path(sys.argv[1]).write_text(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.fixture
async def config(tmp_path: Path) -> Path:
    path = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "targets": {
                "crm": {
                    "type": "http",
                    "url": "http://127.0.0.1:9/leads",
                    "format": "json",
                    "body": '{"n": {{ json.n }}}',
                },
                "mail": {
                    "type": "smtp",
                    "host": "127.0.0.1",
                    "from": "relay@example.com",
                    "to": ["ops@example.com"],
                    "subject": "order {{ json.n }}",
                    "text": "{{ body }}",
                },
            },
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm", "mail"]}},
        },
    )
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    for n in range(3):
        await store.accept_event(
            NewEvent(
                route="orders",
                idempotency_key=None,
                received_at=1_800_000_000.0 + n,
                remote_addr="127.0.0.1",
                payload=Payload(
                    method="POST",
                    path="/hooks/orders",
                    query="",
                    headers=[("Content-Type", "application/json")],
                    content_type="application/json",
                    body=json.dumps({"n": n}).encode(),
                ),
            ),
            [NewDelivery("crm"), NewDelivery("mail")],
            1_800_000_000.0 + n,
        )
    await store.close()
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["--version"],
        ["events"],
        ["events", "--json"],
        ["stats"],
        ["show", "1"],
        ["retry", "1"],
        ["pause", "crm"],
        ["resume", "crm"],
        ["rejections"],
    ],
    ids=" ".join,
)
def test_operator_commands_do_not_import_the_daemon(
    config: Path, tmp_path: Path, command: list[str]
) -> None:
    argv = command if command == ["--version"] else [*command, "--config", str(config)]
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_REPORT, str(report_path), *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    report = json.loads(report_path.read_text())
    assert report["code"] == 0, done.stderr
    assert done.stdout, "the command printed nothing: it did not run"
    loaded = [name for name in (*HEAVY, *DRIVERS) if name in report["modules"]]
    assert loaded == [], f"relay {' '.join(command)} imported {loaded}"


def test_the_heavy_list_is_what_serve_really_loads(config: Path) -> None:
    """The check above means something only if these names are the real ones:
    the daemon's wiring, and Jinja2 for the templates the config holds."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; from pathlib import Path; import relay.app;"
            " from relay.loader import load_config; load_config(Path(sys.argv[1]), {});"
            " print(json.dumps(sorted(sys.modules)))",
            str(config),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    modules = json.loads(done.stdout)
    assert [name for name in HEAVY if name not in modules] == []


def test_the_daemon_on_sqlite_does_not_load_postgresqls_driver() -> None:
    # relay.app named the PostgreSQL store for its cluster-only steps, so every
    # `relay serve` on SQLite imported asyncpg too; it asks the store's role
    # (relay.store.base.Shared) instead.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; import relay.app; print(json.dumps(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "asyncpg" not in json.loads(done.stdout)


# Starts relay on a config without templates, takes a webhook, reports whether
# Jinja2 was loaded; then opens the dashboard's sign-in and reports again.
SERVE_AND_REPORT = """
import asyncio, json, sys
from pathlib import Path
import aiohttp
from relay.app import Relay
from relay.loader import load_config

async def main():
    relay = Relay(load_config(Path(sys.argv[2]), {}))
    await relay.start()
    try:
        async with aiohttp.ClientSession() as session:
            hook = relay.ingress_url + "/hooks/orders"
            async with session.post(hook, json={"n": 1}) as answer:
                assert answer.status == 200, answer.status
            serving = "jinja2" in sys.modules
            async with session.get(relay.admin_url + "/login") as page:
                assert page.status == 200, page.status
                assert "<form" in await page.text()
    finally:
        await relay.stop()
    return {"serving": serving, "dashboard shown": "jinja2" in sys.modules}

Path(sys.argv[1]).write_text(json.dumps(asyncio.run(main())))
"""


def test_a_relay_whose_config_holds_no_template_loads_jinja2_only_for_the_dashboard(
    tmp_path: Path,
) -> None:
    # ~2 MiB of every relay's memory (relay/core/budget.py): a relay that forwards
    # to a CRM as is, alerts included, renders nothing until someone looks.
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0"},
            "admin": {"listen": "127.0.0.1:0", "token": "kq3-Vd9_xPz7LmW2rT8yN4bH6sJ1cF5gA0eU"},
            "storage": {"path": str(tmp_path / "relay.db")},
            "alerts": {"target": "crm"},
            "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/leads"}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", SERVE_AND_REPORT, str(report_path), str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(report_path.read_text()) == {"serving": False, "dashboard shown": True}
