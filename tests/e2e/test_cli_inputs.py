"""What the CLI's database commands say to a bad or missing id, target or time:
the rule and its words are the admin API's (relay.ops.actions, relay.ops.inputs), in one
line on stderr with exit status 2, never a traceback or a 'database error'.

Before: `relay show 99999999999999999999` and `relay resend` with that id
printed SQLite's OverflowError traceback; `relay retry`, `skip` and `requeue`
said 'database error: Python int too large to convert to SQLite INTEGER'
(exit 1, as if the database were broken) where the API answers 400.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from relay.core.payload import Payload
from relay.store import NewDelivery, NewEvent, SqliteStore

from helpers import arelay_cli, relay_cli, write_config

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
        (["requeue", "--since", "last tuesday"], "--since: not a time: 'last tuesday'"),
        # A typo is an error naming the valid ones, never "(none)" or "requeued 0".
        (["events", "--route", "ordres"], "--route: no route ordres (did you mean orders?)"),
        (["requeue", "--route", "no_such_route"], "no route no_such_route; the routes are: orders"),
        (["events", "--target", "cmr"], "--target: no target cmr (did you mean crm?)"),
        (["rejections", "--route", "order"], "--route: no route order (did you mean orders?)"),
        (["pause", "crn"], "no target crn (did you mean crm?); the targets are: crm"),
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


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["events", "--limit", "0"], "argument --limit: expected a whole number from 1"),
        (["events", "--limit", "-5"], "argument --limit: expected a whole number from 1"),
        (["rejections", "--limit", "x"], "argument --limit: expected a whole number from 1"),
        (["events", "--status", "ded"], "invalid choice: 'ded'"),
        (["events", "--roote", "orders"], "unrecognized arguments: --roote orders"),
        (["requeue", "--untill=2h"], "unrecognized arguments: --untill=2h"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_argparse_typos_are_said_under_their_subcommand(
    config: Path, command: list[str], said: str
) -> None:
    """Exit 2, the subcommand's own usage (not the root's list of commands), and
    the option or value the typo resembles."""
    done = relay_cli(*command, "--config", str(config), check=False)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert f"usage: relay {command[0]} " in done.stderr
    close = {
        "ded": "did you mean dead?",
        "--roote": "did you mean --route?",
        "--untill=2h": "did you mean --until?",
    }
    for typo, hint in close.items():
        if typo in command:
            assert hint in done.stderr


async def test_a_route_only_the_database_still_knows_is_no_typo(tmp_path: Path) -> None:
    """A route removed from the config keeps its events: filtering by it is valid."""
    path = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/leads"}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    payload = Payload("POST", "/hooks/old", "", [], "application/json", b"{}")
    await store.accept_event(
        NewEvent("old_leads", None, 1_800_000_000.0, "127.0.0.1", payload),
        [NewDelivery("crm")],
        1_800_000_000.0,
    )
    await store.close()
    done = await arelay_cli("events", "--route", "old_leads", "--config", str(path), check=False)
    assert done.returncode == 0, done.stderr
    assert "old_leads" in done.stdout


async def test_times_are_read_and_shown_in_the_configured_zone(tmp_path: Path) -> None:
    """An operator in Moscow types and reads Moscow time; --json stays UTC."""
    path = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "admin": {"timezone": "Europe/Moscow"},
            "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/leads"}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    payload = Payload("POST", "/hooks/orders", "", [], "application/json", b"{}")
    # 2026-12-01 21:30 and 2026-12-02 12:00 UTC: the 2nd, 00:30 and 15:00 in Moscow.
    for key, at in (("late", 1_796_160_600.0), ("noon", 1_796_212_800.0)):
        await store.accept_event(
            NewEvent("orders", key, at, "127.0.0.1", payload), [NewDelivery("crm")], at
        )
    await store.close()

    async def keys(*options: str) -> list[str]:
        found = await arelay_cli("events", *options, "--json", "--config", str(path))
        return [event["idempotency_key"] for event in orjson.loads(found.stdout)]

    assert await keys("--since", "2026-12-02") == ["noon", "late"]  # Moscow's midnight
    assert await keys("--since", "2026-12-02T15:00") == ["noon"]
    assert await keys("--until", "2026-12-02 15:00") == ["late"]
    assert await keys("--since", "2026-12-02T12:00Z") == ["noon"]
    text = (await arelay_cli("events", "--config", str(path))).stdout
    assert "2026-12-02 15:00:00 +03:00" in text
    assert "2026-12-02 00:30:00 +03:00" in text
    as_json = (await arelay_cli("events", "--json", "--config", str(path))).stdout
    assert '"received_at": "2026-12-02T12:00:00.000Z"' in as_json
