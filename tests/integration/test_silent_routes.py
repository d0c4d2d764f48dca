"""A sender that stops sending is seen (relay.background.silence): a shop's
route, busy by day and quiet by night, learnt from three weeks of its own
events; its webhook stops one Sunday evening. The night makes no noise; the
first busy hour after says it, once, across a restart; the next event says
it is back. A real SQLite file, the clock injected."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from relay.app import Relay
from relay.background.alerts import ALERTS_ROUTE
from relay.background.silence import hour_of_week
from relay.config import Config
from relay.core.clock import FakeClock
from relay.core.payload import Payload
from relay.store import EventQuery, NewDelivery, NewEvent

from conftest import ConfigFactory, RelayFactory

ZONE = ZoneInfo("Europe/Moscow")
TAG = re.compile(r"<[^>]*>")
# Three weeks before a Monday: a shop's route gets an order every hour from
# 09:00 to 21:00; "forms" started two days ago; "strict" says its own limit.
MONDAY = datetime(2026, 12, 28, tzinfo=ZONE)


def local(days: float, hour: float) -> float:
    return (MONDAY + timedelta(days=days, hours=hour)).timestamp()


def routes() -> dict[str, Any]:
    return {
        name: {"path": f"/hooks/{name}", "targets": ["audit"], **extra}
        for name, extra in (("shop", {}), ("forms", {}), ("strict", {"silent_after": "2h"}))
    }


async def store_events(relay: Relay, route: str, moments: list[float]) -> None:
    """Events as ingress stores them, all in one group commit."""

    def new(at: float) -> NewEvent:
        payload = Payload("POST", f"/hooks/{route}", "", [], "application/json", b"{}")
        return NewEvent(route, None, at, "127.0.0.1", payload)

    await asyncio.gather(
        *(relay.store.accept_event(new(at), [NewDelivery("audit")], at) for at in moments)
    )


async def alerts(relay: Relay) -> list[dict[str, Any]]:
    bodies = []
    for view in await relay.store.list_events(EventQuery(route=ALERTS_ROUTE, limit=100)):
        detail = await relay.store.get_event(view.id)
        assert detail is not None
        bodies.append(json.loads(detail.payload.body))
    return list(reversed(bodies))


async def overview(relay: Relay) -> str:
    async with aiohttp.ClientSession() as http, http.get(relay.admin_url + "/") as page:
        return " ".join(html.unescape(TAG.sub(" ", await page.text())).split())


async def metrics(relay: Relay) -> str:
    async with aiohttp.ClientSession() as http, http.get(relay.admin_url + "/metrics") as page:
        return await page.text()


async def test_a_shop_whose_webhook_stops_is_said_silent_in_its_first_busy_hour_not_at_night(
    make_config: ConfigFactory, start_relay: RelayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(local(-21, 0))
    config: Config = make_config(
        {
            "audit": {"type": "file", "path": "audit.jsonl"},
            "ops": {"type": "file", "path": "ops.jsonl"},
        },
        routes(),
        admin={"timezone": "Europe/Moscow"},
        alerts={"target": "ops"},
    )
    relay = await start_relay(config, background=False, clock=clock)
    shop = [local(day, hour) for day in range(-21, 0) for hour in range(9, 22)]
    await store_events(relay, "shop", shop)  # the last one on Sunday 21:00
    await store_events(relay, "forms", [local(day, 12) for day in (-2, -1)])
    await store_events(relay, "strict", [local(-1, 20)])

    # Monday 08:00: eleven hours without an order is an ordinary night.
    clock.set(local(0, 8))
    assert await relay.silence.run_once() is True
    watches = (await relay.store.route_watches()).routes
    assert watches["shop"].last_event_at == local(-1, 21)
    assert watches["shop"].silent_since is None
    # "strict" set 2 h, and it is 12 h: silent, with no history to learn
    # from; "forms" has two days of history, not a week: not judged.
    assert watches["strict"].silent_since == local(0, 8)
    assert watches["forms"].silent_since is None
    await relay.alerter.flush()
    [alert] = await alerts(relay)
    assert alert["summary"] == "relay: route strict is silent"

    # Monday noon, the first busy hours without an order: 15 h of silence,
    # where the hour usually has 1 h at most.
    clock.set(local(0, 12))
    await relay.silence.run_once()
    watches = (await relay.store.route_watches()).routes
    assert watches["shop"].silent_since == local(0, 12)
    assert (watches["shop"].usual, watches["shop"].limit) == (3600.0, 3 * 3600.0)
    await relay.alerter.flush()
    [_, alert] = await alerts(relay)
    assert alert["summary"] == "relay: route shop is silent"
    [said] = alert["silent"]
    assert (said["route"], said["silent_seconds"], said["usual_seconds"]) == (
        "shop",
        15 * 3600,
        3600,
    )
    assert "WooCommerce disables a webhook" in alert["text"]
    text = await overview(relay)
    assert "Route shop has received nothing for 15h00m" in text
    assert "usually silent 1h00m at most" in text
    assert 'relay_route_silent{route="shop"} 1.0' in await metrics(relay)

    # Said once, across a restart.
    await relay.stop()
    relay = await start_relay(config, background=False, clock=clock)
    clock.set(local(0, 13))
    await relay.silence.run_once()
    await relay.alerter.flush()
    assert len(await alerts(relay)) == 2

    # An order at 13:30: back, said once; the silence is not learnt as usual.
    await store_events(relay, "shop", [local(0, 13.5)])
    clock.set(local(0, 13.6))
    with caplog.at_level(logging.WARNING, logger="relay.silence"):
        await relay.silence.run_once()
    assert "route shop receives again, after 16h30m of silence" in caplog.text  # the journal
    await relay.alerter.flush()
    [*_, back] = await alerts(relay)
    assert back["summary"] == "relay: route shop receives again"
    assert back["back"] == [{"route": "shop", "silent_seconds": 16.5 * 3600}]
    assert (await relay.store.route_watches()).routes["shop"].silent_since is None
    assert 'relay_route_silent{route="shop"} 0.0' in await metrics(relay)
    assert "Route shop" not in await overview(relay)
    week, noon = hour_of_week(local(0, 12), ZONE)
    assert (await relay.store.route_rhythm(noon, range(week, week + 1))).get("shop") is None
