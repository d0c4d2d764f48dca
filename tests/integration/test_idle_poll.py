"""The scheduler's poll on an idle relay: it looks before it claims, so it
writes nothing, and it still picks up what another process made due."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.background.indexer import SETTLE
from relay.store import SqliteStore, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import post_accepted

ROUTES = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}
POLL = 0.02  # seconds: many polls in a short test


async def post(relay: Relay, http: aiohttp.ClientSession) -> int:
    return await post_accepted(http, relay.ingress_url + "/hooks/orders", b'{"order": 1}')


async def settled(relay: Relay, event_id: int, status: Status) -> int:
    """The event's one delivery once it reaches `status` (within 5 s); its id."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = await relay.store.get_event(event_id)
        assert found is not None
        [delivery] = found.event.deliveries
        if delivery.status is status:
            return delivery.id
        await asyncio.sleep(POLL)
    raise AssertionError(f"delivery of event {event_id} never became {status.value}")


async def test_an_idle_relay_polls_without_writing(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    _, url = await start_sink()
    relay = await start_relay(
        make_config({"crm": {"type": "http", "url": url}}, ROUTES), poll_interval=POLL
    )
    assert isinstance(relay.store, SqliteStore)
    await settled(relay, await post(relay, http), Status.DELIVERED)
    await relay.indexer.catch_up()
    # The background indexer's own look (SETTLE after the webhook) finds it done.
    await asyncio.sleep(SETTLE + 5 * POLL)
    writes, ticked = relay.store.write_stats, relay.scheduler.last_tick
    await asyncio.sleep(25 * POLL)
    assert relay.scheduler.last_tick != ticked  # it did poll
    # Claiming on every poll was a write transaction each time.
    assert relay.store.write_stats == writes


async def test_the_poll_picks_up_a_retry_asked_for_by_another_process(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([422, 200])  # refused for good, then taken
    config = make_config({"crm": {"type": "http", "url": url}}, ROUTES)
    relay = await start_relay(config, poll_interval=POLL)
    event_id = await post(relay, http)
    delivery_id = await settled(relay, event_id, Status.DEAD)
    # `relay retry` from a shell: its own store on the same file; nothing
    # wakes the serving process, only its poll can see the delivery is due.
    other = SqliteStore(config.storage.path)
    await other.open()
    try:
        await other.retry_now(delivery_id, time.time())
    finally:
        await other.close()
    assert await settled(relay, event_id, Status.DELIVERED) == delivery_id
    assert len(sink.requests) == 2


@pytest.mark.parametrize("beside", [{}, {"mail": {"type": "http", "url": "http://127.0.0.1:9/"}}])
async def test_webhooks_arriving_while_their_target_is_full_do_not_turn_the_scheduler(
    beside: dict[str, Any],
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # A CRM that hangs holds its lane full: a webhook stored meanwhile must not
    # wake the scheduler for a turn that can claim nothing. The attempt that
    # ends wakes it, and it claims what came meanwhile. Another target with room
    # (`beside`, on no route here; or paused, or gone from the config) must
    # not wake it for webhooks whose own targets are full.
    release = asyncio.Event()

    async def hang_first(request: web.Request, number: int) -> web.Response:
        if number == 0:
            await release.wait()
        return web.Response(text="ok")

    sink, url = await start_sink(hang_first)
    relay = await start_relay(
        make_config({"crm": {"type": "http", "url": url, "concurrency": 1}, **beside}, ROUTES),
        poll_interval=60.0,
    )
    first = await post(relay, http)
    try:
        await sink.wait_for(1)
        await asyncio.sleep(0.05)  # the turn after the claim has ended
        ticked = relay.scheduler.last_tick
        later = [await post(relay, http) for _ in range(5)]
        await asyncio.sleep(0.05)
        assert relay.scheduler.last_tick == ticked
    finally:
        release.set()
    await settled(relay, first, Status.DELIVERED)
    for event_id in later:
        await settled(relay, event_id, Status.DELIVERED)
