"""A reload reaches every component through its reconfigure(config), with the
new config's one masker: a secret that appears only in the new config is
masked in what the scheduler stores, in the log and in the search index, from
the first attempt."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from relay import app
from relay.core.clock import FakeClock
from relay.loader import load_config
from relay.ops.search import parse_search
from relay.ops.systemd import Notifier
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import eventually, write_config
from unit.test_watchdog import NotifySocket

NEW_TOKEN = "tok-new-8c1d9e2f"


async def test_a_reload_masks_the_new_configs_secrets_everywhere(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def echo(request: web.Request, number: int) -> web.StreamResponse:
        # A receiver that repeats the credential it was sent, and fails.
        return web.Response(status=500, text=f"bad key {request.headers.get('X-Key')}")

    sink, url = await start_sink(echo)
    routes = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}
    before = make_config({"crm": {"type": "http", "url": url}}, routes, retry={"retries": 0})
    after = make_config(
        {"crm": {"type": "http", "url": url, "headers": {"X-Key": "${CRM_KEY}"}}},
        routes,
        retry={"retries": 0},
        environ={"CRM_KEY": NEW_TOKEN},
    )
    assert NEW_TOKEN in after.secrets
    assert NEW_TOKEN not in before.secrets
    relay = await start_relay(before, background=False, clock=FakeClock())
    assert await relay.reload(after) == []
    assert relay.masker is relay.config.masker
    assert relay.console.masker is relay.config.masker  # the API's and dashboard's too

    caplog.set_level(logging.DEBUG)
    async with http.post(relay.ingress_url + "/hooks/orders", data=b"{}") as answer:
        assert answer.status == 200
    await relay.scheduler.drain()
    assert sink.requests[0].headers["X-Key"] == NEW_TOKEN  # it was sent
    (event,) = await relay.store.list_events(EventQuery())
    detail = await relay.store.get_event(event.id)
    assert detail is not None
    (attempt,) = [a for attempts in detail.attempts.values() for a in attempts]
    assert attempt.response == b"bad key ***"
    assert NEW_TOKEN not in caplog.text
    # A sender that echoes the credential: the index holds it masked.
    async with http.post(relay.ingress_url + "/hooks/orders", data=NEW_TOKEN.encode()) as answer:
        assert answer.status == 200
    assert await relay.indexer.catch_up() == 2
    search = EventQuery(search=parse_search("8c1d9e2f"))
    assert await relay.store.list_events(search) == []


async def test_a_failed_reloads_status_line_stays_until_one_succeeds(
    tmp_path: Path, start_relay: RelayFactory
) -> None:
    """`systemctl status` showed "reload failed" for the seconds until the next
    status refresh wrote "pending 0, dead 0" over it: now every status line
    leads with it until a reload succeeds."""
    path = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0"},
            "admin": {"listen": "127.0.0.1:0"},
            "storage": {"path": str(tmp_path / "relay.db")},
            "targets": {"audit": {"type": "file", "path": str(tmp_path / "audit.jsonl")}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["audit"]}},
        },
    )
    relay = await start_relay(load_config(path, {}), background=False)
    notify = NotifySocket()
    notifier = Notifier({"NOTIFY_SOCKET": notify.path})
    try:
        path.write_text(path.read_text() + "\n[routes.leads]\nlisen = 1\n")
        await app._reload(relay, notifier)
        failed = "reload failed (previous config kept): routes.leads"

        async def said() -> bool:
            return any(failed in text for _, text in notify.messages)

        await eventually(said)
        # What the watchdog task sends every 10 s (relay.ops.systemd.watchdog's summary).
        for _ in range(2):
            line = await relay.status_line()
            assert line.startswith(failed), line
            assert "pending 0, dead 0" in line
        path.write_text(path.read_text().replace("\n[routes.leads]\nlisen = 1\n", ""))
        await app._reload(relay, notifier)
        assert (await relay.status_line()).startswith("pending 0, dead 0")
    finally:
        notify.close()
