"""Per-target rate limits: a burst is paced, no 429 is provoked, no retry is spent."""

from __future__ import annotations

from collections import deque

import aiohttp
from aiohttp import web

from relay.clock import FakeClock
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import post_events


async def test_a_burst_to_a_rate_limited_crm_is_paced(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    clock = FakeClock()
    window: deque[float] = deque()
    rejected = 0

    def strict_crm(request: web.Request, number: int) -> web.StreamResponse:
        """Refuses the 51st request within any second, like a CRM with a quota."""
        nonlocal rejected
        now = clock.now()
        while window and window[0] <= now - 1.0:
            window.popleft()
        if len(window) >= 50:
            rejected += 1
            return web.Response(status=429, headers={"Retry-After": "1"})
        window.append(now)
        return web.Response(status=200)

    sink, url = await start_sink(strict_crm)
    config = make_config(
        {"crm": {"type": "http", "url": url, "rate": "50/s", "concurrency": 8}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
    )
    relay = await start_relay(config, background=False, clock=clock)
    await post_events(relay.ingress_url + "/hooks/orders", 1000)
    started = clock.now()
    await relay.scheduler.drain()
    elapsed = clock.now() - started

    assert len(sink.requests) == 1000
    assert rejected == 0
    assert elapsed >= 19.0
    events = await relay.store.list_events(EventQuery(limit=1000))
    assert len(events) == 1000
    assert {(d.status.value, d.attempts) for e in events for d in e.deliveries} == {
        ("delivered", 1)
    }
