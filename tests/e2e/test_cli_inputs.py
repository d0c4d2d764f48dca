"""What the CLI's operator commands say to a bad or missing id, target or time:
the rule and its words are the admin API's (relay.actions, relay.inputs), in one
line on stderr with exit status 2, never a traceback or a 'database error'.

Before: `relay show 99999999999999999999` and `relay resend` with that id
printed SQLite's OverflowError traceback; `relay retry`, `skip` and `requeue`
said 'database error: Python int too large to convert to SQLite INTEGER'
(exit 1, as if the database were broken) where the API answers 400.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.store import SqliteStore

from helpers import relay_cli, write_config

TOO_BIG = "99999999999999999999"  # past SQLite's 64-bit integers


@pytest.fixture
async def config(tmp_path: Path) -> Path:
    path = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/leads"}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    store = SqliteStore(tmp_path / "relay.db")  # the service's database, empty
    await store.open()
    await store.close()
    return path


WHOLE_NUMBER = "expected a whole number from 1 to 9223372036854775807"


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["show", TOO_BIG], f"event id: {WHOLE_NUMBER}"),
        (["resend", TOO_BIG, "--body", "-", "--yes"], f"event id: {WHOLE_NUMBER}"),
        (["retry", TOO_BIG], f"delivery id: {WHOLE_NUMBER}"),
        (["skip", TOO_BIG], f"delivery id: {WHOLE_NUMBER}"),
        (["requeue", TOO_BIG], f"delivery id: {WHOLE_NUMBER}"),
        (["retry", "²"], f"delivery id: {WHOLE_NUMBER}"),
        (["show", "404"], "no event 404"),
        (["resend", "404", "--body", "-", "--yes"], "no event 404"),
        (["retry", "404"], "no delivery 404"),
        (["pause", "nowhere"], "no target nowhere"),
        (["requeue", "--since", "last tuesday"], "--since: expected an ISO 8601 time"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_one_line_the_api_would_say_too(config: Path, command: list[str], said: str) -> None:
    done = relay_cli(*command, "--config", str(config), check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("relay: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert said in done.stderr
    # (That the ids which exist still work, `relay show 1` and `relay retry 1`,
    # tests/e2e/test_cli_imports.py runs.)
