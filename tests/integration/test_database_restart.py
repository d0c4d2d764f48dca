"""The PostgreSQL server restarted under a running relay: webhooks are
answered 503 meanwhile, and the log says so once, not once a webhook.

Before (issue 40): a 2 s restart wrote 46-52 ERROR lines an instance, one per
webhook answered 503, asyncpg's internals among them
("InternalClientError: cannot switch to state 15").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.store import Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import eventually
from pgcluster import Cluster, create_cluster, remove_cluster, server_bin

pytestmark = pytest.mark.postgres


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A cluster this test may stop and start."""
    if server_bin() is None:
        pytest.skip("PostgreSQL server binaries not found")
    cluster = create_cluster()
    try:
        yield cluster
    finally:
        remove_cluster(cluster)


async def post(http: aiohttp.ClientSession, relay: Relay, key: str) -> int:
    async with http.post(
        relay.ingress_url + "/hooks/orders", data=b"{}", headers={"Idempotency-Key": key}
    ) as response:
        await response.read()
        return response.status


async def test_a_database_restart_is_one_line_when_it_goes_and_one_when_it_is_back(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    own_cluster: Cluster,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, url = await start_sink([200])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        storage={"url": own_cluster.url("postgres"), "busy_timeout": "1s"},
    )
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    assert await post(http, relay, "before") == 200
    caplog.clear()
    await asyncio.to_thread(own_cluster.stop, "fast")
    refused = [await post(http, relay, f"away{n}") for n in range(20)]
    clock.advance(61)  # a minute on: said again, once
    refused += [await post(http, relay, f"still{n}") for n in range(5)]
    await asyncio.to_thread(own_cluster.start)
    for n in range(100):  # the pool connects again by itself
        if await post(http, relay, f"after{n}") == 200:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("events were never stored again")
    assert set(refused) == {503}
    said = [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if record.name == "relay.ingress" or record.name.startswith("asyncpg")
    ]
    errors = [message for level, message in said if level == "ERROR"]
    assert len(errors) == 2, said
    assert errors[0].startswith("events cannot be stored, answering 503 with Retry-After")
    assert errors[1].startswith("events still cannot be stored, for 1m")
    [back] = [message for _, message in said if "stored again" in message]
    assert back.startswith("events are stored again, after 1m")
    assert f": {len(refused) + n} answered 503 meanwhile" in back
    assert not any("asyncpg" in message or "InternalClientError" in message for _, message in said)
    assert not [r for r in caplog.records if r.name.startswith("asyncpg")]


async def test_attempts_made_while_the_database_is_away_say_so_once_and_are_all_recorded(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    own_cluster: Cluster,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Five deliveries under way when the database stops: each answer comes
    # back with nowhere to record it. The outage needs one line, not one each.
    caplog.set_level(logging.DEBUG, logger="relay.scheduler")
    answer = asyncio.Event()

    async def slow(request: web.Request, number: int) -> web.StreamResponse:
        await answer.wait()
        return web.Response(text="ok")

    sink, url = await start_sink(slow)
    config = make_config(
        {"crm": {"type": "http", "url": url, "concurrency": 5}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        storage={"url": own_cluster.url("postgres"), "busy_timeout": "1s"},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    for n in range(5):
        assert await post(http, relay, f"k{n}") == 200
    assert await relay.scheduler.run_once() == 5
    await sink.wait_for(5)
    caplog.clear()
    await asyncio.to_thread(own_cluster.stop, "fast")
    answer.set()

    async def every_record_tried() -> bool:
        tried = {
            r.args[0] for r in caplog.records if str(r.msg).startswith("cannot record attempt")
        }
        return len(tried) == 5

    await eventually(every_record_tried)
    await asyncio.to_thread(own_cluster.start)
    await asyncio.wait_for(relay.scheduler.wait_idle(), timeout=30)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    recorded = [m for m in said if "recorded" in m or "record attempt" in m]
    assert len(recorded) == 1, said
    assert recorded[0].startswith("attempts made wait to be recorded: ")
    stats = await relay.store.stats()
    assert stats.counts_by_target["crm"] == {Status.DELIVERED: 5}
