"""Per-target rate limits: a burst is paced, no 429 is provoked, no retry is spent."""

from __future__ import annotations

import itertools
import time
from collections import deque

import aiohttp
import pytest
from aiohttp import web

from relay.config import ConfigError
from relay.core.clock import FakeClock
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
    # Six of the CRM's seconds: as many windows as it takes (1000 took 2 s of CPU).
    await post_events(relay.ingress_url + "/hooks/orders", 300)
    started = clock.now()
    await relay.scheduler.drain()
    elapsed = clock.now() - started

    assert len(sink.requests) == 300
    assert rejected == 0
    assert elapsed >= 5.9  # 300 at 50/s: the last 299/50 s after the first
    events = await relay.store.list_events(EventQuery(limit=300))
    assert len(events) == 300
    assert {(d.status.value, d.attempts) for e in events for d in e.deliveries} == {
        ("delivered", 1)
    }


def most_in_any_window(times: list[float], window: float) -> int:
    times = sorted(times)
    most, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most


async def test_telegram_is_paced_per_chat_and_a_group_at_20_a_minute(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    clock = FakeClock()
    sent: dict[str, list[float]] = {}

    async def bot_api(request: web.Request, number: int) -> web.StreamResponse:
        chat = str((await request.json())["chat_id"])
        sent.setdefault(chat, []).append(clock.now())
        return web.json_response({"ok": True, "result": {"message_id": number}})

    _, url = await start_sink(bot_api, path="")
    bot = {"type": "telegram", "bot_token": "123:AA", "api_base": url.rstrip("/")}
    config = make_config(
        {
            # Two targets post to one group: they share its 20 messages a minute.
            "sales": {**bot, "chat_id": -1001234567890, "text": "sale {{ body }}"},
            "ops": {**bot, "chat_id": -1001234567890, "text": "ops {{ body }}"},
            "owner": {**bot, "chat_id": 42, "text": "owner {{ body }}"},
        },
        {"leads": {"path": "/hooks/leads", "targets": ["sales", "ops", "owner"]}},
    )
    relay = await start_relay(config, background=False, clock=clock)
    await post_events(relay.ingress_url + "/hooks/leads", 20)
    started = clock.now()
    await relay.scheduler.drain()

    group, private = sent["-1001234567890"], sent["42"]
    assert len(group) == 40
    assert len(private) == 20
    assert most_in_any_window(group, 60.0) <= 20
    assert most_in_any_window(private, 1.0) <= 1
    assert max(group) - started >= 39 * 3.0  # 40 messages, one every 3 s
    assert max(private) - started < 25.0  # a private chat is not held to the group's pace


async def test_two_targets_on_one_portal_share_its_rate(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    clock = FakeClock()
    calls: list[float] = []

    def portal(request: web.Request, number: int) -> web.StreamResponse:
        calls.append(clock.now())
        return web.json_response({"result": number})

    _, url = await start_sink(portal, path="/rest/1/abc/")
    b24 = {"type": "http", "rate": "2/s", "rate_group": "portal"}
    config = make_config(
        {
            "lead": {**b24, "url": url + "crm.lead.add.json"},
            "deal": {**b24, "url": url + "crm.deal.add.json"},
        },
        {"orders": {"path": "/hooks/orders", "targets": ["lead", "deal"]}},
    )
    relay = await start_relay(config, background=False, clock=clock)
    await post_events(relay.ingress_url + "/hooks/orders", 20)
    started = clock.now()
    await relay.scheduler.drain()
    assert len(calls) == 40
    assert most_in_any_window(calls, 1.0) <= 2  # the portal's 2/s, not 2/s per target
    assert max(calls) - started >= 19.0


async def test_a_late_send_never_brings_the_next_ones_too_close(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # Real time: the first request renders a slow template (tens of ms in a
    # worker thread) and goes out late; the next two render at once. Spaced
    # from the moment each was claimed, the third came less than a second
    # after the first: three requests in one second at "2/s".
    arrived: list[float] = []

    def crm(request: web.Request, number: int) -> web.StreamResponse:
        arrived.append(time.monotonic())
        return web.Response(status=200)

    sink, url = await start_sink(crm)
    slow = '{% for i in range(json.n) %}{% for j in range(200) %}{% endfor %}{% endfor %}{"ok": 1}'
    config = make_config(
        {"crm": {"type": "http", "url": url, "rate": "2/s", "format": "json", "body": slow}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
    )
    relay = await start_relay(config)
    for n in (500, 0, 0, 0):
        async with http.post(relay.ingress_url + "/hooks/orders", json={"n": n}) as answer:
            assert answer.status == 200
    await sink.wait_for(4, timeout=10)
    gaps = [b - a for a, b in itertools.pairwise(arrived)]
    assert most_in_any_window(arrived, 1.0) <= 2, gaps


async def test_a_429_holds_the_whole_rate_group_for_its_retry_after(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    # RFC 9110 §10.2.3: Retry-After says how long "the user agent ought to
    # wait before making a follow-up request": any request, not that one.
    clock = FakeClock()
    calls: list[tuple[float, int]] = []

    def portal(request: web.Request, number: int) -> web.StreamResponse:
        calls.append((clock.now(), number))
        if number == 3:
            return web.Response(status=429, headers={"Retry-After": "5"})
        return web.json_response({"result": number})

    _, url = await start_sink(portal, path="/rest/1/abc/")
    b24 = {"type": "http", "rate": "2/s", "rate_group": "portal"}
    config = make_config(
        {
            "lead": {**b24, "url": url + "crm.lead.add.json"},
            "deal": {**b24, "url": url + "crm.deal.add.json"},
        },
        {"orders": {"path": "/hooks/orders", "targets": ["lead", "deal"]}},
    )
    relay = await start_relay(config, background=False, clock=clock)
    await post_events(relay.ingress_url + "/hooks/orders", 5)
    await relay.scheduler.drain()
    assert len(calls) == 11
    limited_at = next(at for at, number in calls if number == 3)
    assert not [at for at, _ in calls if limited_at < at < limited_at + 5]
    events = await relay.store.list_events(EventQuery())
    attempts = sorted(d.attempts for e in events for d in e.deliveries)
    assert attempts == [1] * 9 + [2]  # only the one that met the 429


def test_a_rate_group_needs_one_rate(make_config: ConfigFactory) -> None:
    targets = {
        "lead": {"type": "http", "url": "https://b24.example/a", "rate": "2/s", "rate_group": "p"},
        "deal": {"type": "http", "url": "https://b24.example/b", "rate": "5/s", "rate_group": "p"},
    }
    routes = {"orders": {"path": "/hooks/orders", "targets": ["lead", "deal"]}}
    with pytest.raises(ConfigError, match='rate_group "p" is paced at 2/s'):
        make_config(targets, routes)
    del targets["deal"]["rate"]
    with pytest.raises(ConfigError, match="rate_group: needs a rate"):
        make_config(targets, routes)
