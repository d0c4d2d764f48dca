"""The clock jumps by hours, back and forth: no delivery is lost, none is sent
early by more than the jump, and an attempt in flight is never sent twice."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from relay.core.clock import FakeClock
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from figures import record_figures
from helpers import post_events

pytestmark = pytest.mark.chaos

HOURS = 3 * 3600.0


async def test_jumps_back_and_forth_lose_nothing_and_send_nothing_early(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    clock = FakeClock()
    arrivals: list[float] = []

    def answer(request: web.Request, number: int) -> web.StreamResponse:
        arrivals.append(clock.now())
        return web.Response(status=503 if number < 60 else 200)

    _sink, url = await start_sink(answer)
    config = make_config(
        {
            "crm": {
                "type": "http",
                "url": url,
                "concurrency": 20,
                "retry": {"delays": ["10m"], "retries": 5},
            }
        },
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        retry={"retries": 5},
    )
    relay = await start_relay(config, background=False, clock=clock)
    await post_events(relay.ingress_url + "/hooks/orders", 20)
    await relay.scheduler.run_once()
    await relay.scheduler.wait_idle()  # 20 first attempts failed: due again in 10 minutes
    scheduled = {
        d.id: d.next_attempt_at
        for e in await relay.store.list_events(EventQuery())
        for d in e.deliveries
    }
    assert set(scheduled.values()) == {clock.now() + 600}, (clock.now(), scheduled)

    clock.advance(-HOURS)  # back three hours: nothing is due any more
    assert await relay.scheduler.run_once() == 0
    clock.advance(HOURS + 300)  # forward again, to five minutes before they are due
    assert await relay.scheduler.run_once() == 0
    clock.advance(HOURS)  # three hours ahead of them: all due, all sent
    await relay.scheduler.drain()
    events = await relay.store.list_events(EventQuery())
    assert len(events) == 20
    assert {d.status for e in events for d in e.deliveries} == {Status.DELIVERED}
    early = 0
    for event in events:
        detail = await relay.store.get_event(event.id)
        assert detail is not None
        for delivery in detail.event.deliveries:
            retries = detail.attempts[delivery.id][1:]
            # The clock went back three hours: a retry may come that much "early"
            # on the new clock, never more.
            early += sum(a.started_at < scheduled[delivery.id] - HOURS for a in retries)
    assert early == 0
    record_figures(
        "clock_jumps", {"jump_hours": 3, "deliveries": 20, "lost": 0, "sent_early": early}
    )


async def test_a_jump_ahead_does_not_resend_an_attempt_in_flight(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    clock = FakeClock()
    release = asyncio.Event()

    async def slow(request: web.Request, number: int) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=200)

    sink, url = await start_sink(slow)
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
    )
    relay = await start_relay(config, background=False, clock=clock)
    async with (
        aiohttp.ClientSession() as http,
        http.post(relay.ingress_url + "/hooks/orders", data=b"{}") as response,
    ):
        assert response.status == 200
    assert await relay.scheduler.run_once() == 1
    await sink.wait_for(1)
    clock.advance(HOURS)  # the lease looks long expired
    assert await relay.scheduler.run_once() == 0  # but this process still has it under way
    release.set()
    await relay.scheduler.wait_idle()
    assert len(sink.requests) == 1
