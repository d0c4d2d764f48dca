"""Output for scripts: every command takes --json, and `relay export` gives a
person their data, one event a line, the body decoded, with its deliveries.

Before: pause/resume had no --json and `events --json` no bodies; there was
no export.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from urllib.parse import quote

from relay.cli import parser
from relay.core.payload import Payload
from relay.store import NewDelivery, NewEvent, SqliteStore

from helpers import arelay_cli, relay_json, write_config

T0 = 1_796_212_800.0  # 2026-12-02 12:00 UTC


def test_every_command_but_serve_takes_json() -> None:
    [commands] = [
        a
        for a in parser()._subparsers._group_actions  # type: ignore[union-attr]
        if isinstance(a, argparse._SubParsersAction)
    ]
    without = [
        name for name, sub in commands.choices.items() if "--json" not in sub._option_string_actions
    ]
    assert without == ["serve"]


async def _service(tmp_path: Path) -> Path:
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/leads"}},
            "routes": {
                "tilda": {"path": "/hooks/tilda", "targets": ["crm"]},
                "shop": {"path": "/hooks/shop", "targets": ["crm"]},
            },
        },
    )
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    # A Tilda lead (tests/fixtures/tilda: form fields, percent-encoded UTF-8),
    # an order in JSON a day earlier.
    lead = f"Name={quote('Анна Петрова')}&Email=anna%40example.com&tranid=1:1".encode()
    for route, body, kind, at in (
        ("shop", b'{"id": 7, "total": "990.00"}', "application/json", T0 - 86400),
        ("tilda", lead, "application/x-www-form-urlencoded", T0),
    ):
        payload = Payload("POST", f"/hooks/{route}", "", [("Content-Type", kind)], kind, body)
        await store.accept_event(
            NewEvent(route, None, at, "127.0.0.1", payload), [NewDelivery("crm")], at
        )
    await store.close()
    return config


async def test_export_writes_one_event_a_line_with_its_body_decoded(tmp_path: Path) -> None:
    config = await _service(tmp_path)
    done = await arelay_cli("export", "--config", str(config))
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["route"] for e in lines] == ["tilda", "shop"]  # newest first
    lead, order = lines
    assert lead["data"] == {"Name": "Анна Петрова", "Email": "anna@example.com", "tranid": "1:1"}
    assert order["data"] == {"id": 7, "total": "990.00"}
    assert lead["deliveries"][0]["target"] == "crm"
    assert lead["deliveries"][0]["attempts_log"] == []
    assert lead["received_at"] == "2026-12-02T12:00:00.000Z"
    # Filters as every listing takes them.
    since = await arelay_cli("export", "--since", "2026-12-02T00:00Z", "--config", str(config))
    assert [json.loads(line)["route"] for line in since.stdout.splitlines()] == ["tilda"]
    only = await arelay_cli("export", "--route", "shop", "--config", str(config))
    assert [json.loads(line)["route"] for line in only.stdout.splitlines()] == ["shop"]
    typo = await arelay_cli("export", "--route", "tlida", "--config", str(config), check=False)
    assert typo.returncode == 2
    assert "did you mean tilda?" in typo.stderr


async def test_commands_that_printed_sentences_print_json(tmp_path: Path) -> None:
    config = await _service(tmp_path)
    assert relay_json("pause", "crm", "--config", str(config)) == {
        "target": "crm",
        "paused": True,
    }
    assert relay_json("resume", "crm", "--config", str(config))["paused"] is False
    checked = relay_json("check", "--config", str(config))
    assert checked["ok"] is True
    assert [r["name"] for r in checked["routes"]] == ["tilda", "shop"]
    assert checked["routes"][0]["targets"][0]["target"] == "crm"
    backup = relay_json("backup", str(tmp_path / "copy.db"), "--config", str(config))
    assert backup["events"] == 2
    assert backup["mode"] == "600"
    purged = relay_json("purge", "--dry-run", "--config", str(config))
    assert purged == {"removed": 0, "would_remove": 0, "dry_run": True}
    (tmp_path / "lead.txt").write_text("Name=Anna&tranid=2:2")
    rendered = relay_json(
        "render", "tilda", "--body", str(tmp_path / "lead.txt"), "--config", str(config)
    )
    assert rendered["targets"][0]["target"] == "crm"
    assert rendered["targets"][0]["outcome"] == "sent"
    assert "  Name = Anna" in rendered["targets"][0]["request"]
    made = relay_json("init", str(tmp_path / "new" / "relay.toml"))
    assert made["admin_token_file"] == str(tmp_path / "new" / "credentials" / "relay_admin_token")
