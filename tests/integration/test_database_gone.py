"""A database file deleted or moved away under a running relay: refuse, say so loudly.

Before: after `rm relay.db*` relay answered 200 to 20 more webhooks and
/readyz said ready; at the next start all of them were gone.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import aiohttp
import pytest

from relay.app import Relay

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import Sink


async def post(http: aiohttp.ClientSession, relay: Relay) -> aiohttp.ClientResponse:
    async with http.post(relay.ingress_url + "/orders", data=b'{"n": 1}') as response:
        await response.read()
        return response


async def ready(http: aiohttp.ClientSession, relay: Relay) -> tuple[int, str]:
    async with http.get(relay.admin_url + "/readyz") as response:
        return response.status, await response.text()


async def start(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> tuple[Relay, Sink]:
    ops, ops_url = await start_sink([200])
    config = make_config(
        {"audit": {"type": "file", "path": "a.jsonl"}, "ops": {"type": "http", "url": ops_url}},
        {"orders": {"path": "/orders", "targets": ["audit"]}},
        alerts={"target": "ops", "group_window": "10ms"},
    )
    return await start_relay(config, poll_interval=0.05), ops


async def test_deleted_database_gets_503_a_failed_readyz_a_critical_line_and_an_alert(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay, ops = await start(make_config, start_relay, start_sink)
    assert (await post(http, relay)).status == 200
    database = relay.config.storage.path
    for path in database.parent.glob(database.name + "*"):
        if not path.name.endswith(".lock"):
            path.unlink()
    answer = await post(http, relay)
    assert answer.status == 503
    assert answer.headers["Retry-After"]
    status, text = await ready(http, relay)
    assert status == 503
    assert "was deleted or moved away" in text

    await ops.wait_for(1)  # the alert, delivered from the file still open
    alert = json.loads(ops.requests[0].body)
    assert "was deleted or moved away" in alert["text"]
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 1
    assert "/proc/" in critical[0]  # where to copy the deleted file back from


async def test_a_renamed_database_refuses_until_it_is_back(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, _ = await start(make_config, start_relay, start_sink)
    database: Path = relay.config.storage.path
    moved = database.with_name("moved.db")
    os.rename(database, moved)
    assert (await post(http, relay)).status == 503
    os.rename(moved, database)
    assert (await post(http, relay)).status == 200
    assert (await ready(http, relay))[0] == 200
