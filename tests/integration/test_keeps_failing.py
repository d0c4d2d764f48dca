"""A delivery that keeps failing is seen: one payload the receiver always
refuses, on a target that takes every other (the week's poison lead on a
busy CRM). Its route never fails `failing_after` times in a row, so no route
alert says it; the delivery's own attempts do, within minutes, not 18 hours."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from relay.app import Relay
from relay.background.alerts import ALERTS_ROUTE
from relay.core.clock import FakeClock
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import relay_cli, write_config

ROUTES = {"leads": {"path": "/hooks/leads", "targets": ["crm"]}}
TAG = re.compile(r"<[^>]*>")


async def post(relay: Relay, n: int, **fields: Any) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(relay.ingress_url + "/hooks/leads", json={"n": n, **fields}) as answer,
    ):
        assert answer.status == 200
        return int((await answer.json())["id"])


async def alerts(relay: Relay) -> list[dict[str, Any]]:
    """Alerts created so far, oldest first."""
    bodies = []
    for view in await relay.store.list_events(EventQuery(route=ALERTS_ROUTE, limit=100)):
        detail = await relay.store.get_event(view.id)
        assert detail is not None
        bodies.append(json.loads(detail.payload.body))
    return list(reversed(bodies))


async def test_a_poison_lead_on_a_busy_crm_is_listed_counted_and_alerted_once(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    clock = FakeClock()

    async def crm(request: web.Request, number: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        if body.get("poison"):
            return web.Response(status=500, text='{"error": "field PHONE is invalid"}')
        return web.Response(text="ok")

    _, url = await start_sink(crm)
    targets = {"crm": {"type": "http", "url": url}, "ops": {"type": "file", "path": "ops.jsonl"}}
    config = make_config(targets, ROUTES, alerts={"target": "ops"})
    relay = await start_relay(config, background=False, clock=clock)
    poison = await post(relay, 0, poison=True)

    async def busy_until(at: float, n: int) -> int:
        """Leads every 2 s, each delivered at once, until `at`."""
        while clock.now() < at:
            clock.advance(min(2.0, at - clock.now()))
            await post(relay, n)
            n += 1
            await relay.scheduler.run_once()
            await relay.scheduler.wait_idle()
        return n

    # Its first attempt and four retries (2, 4, 8, 16 s), leads delivered between.
    n = 1
    await relay.scheduler.run_once()
    await relay.scheduler.wait_idle()
    for after in (2, 6, 14, 30):
        n = await busy_until(clock.now() + after, n)
    n = await busy_until(clock.now() + 1, n)
    await relay.alerter.flush()
    [alert] = await alerts(relay)
    assert alert["summary"] == "relay: 1 delivery keeps failing"
    [item] = alert["keeps_failing"]
    assert (item["event_id"], item["attempts"], item["cycle"]) == (str(poison), 5, 16)
    assert item["answer"] == '{"error": "field PHONE is invalid"}'
    assert f"relay show {poison}" in alert["text"]
    assert alert["failing"] == []  # the route's streak never adds up

    # Seen without the alert: the Overview, the listings, the gauge.
    [event] = await relay.store.list_events(EventQuery(failing=5))
    assert event.id == poison
    async with http.get(relay.admin_url + "/") as page:
        text = " ".join(html.unescape(TAG.sub(" ", await page.text())).split())
    assert "Nothing needs you" not in text
    assert re.search(
        rf"Delivery \d+ of event {poison} \(leads → crm\) keeps failing: 5 attempts", text
    )
    async with http.get(relay.admin_url + "/api/v1/events?failing=true") as answer:
        assert [e["id"] for e in (await answer.json())["events"]] == [str(poison)]
    async with http.get(relay.admin_url + "/deliveries?failing=true") as page:
        assert f'href="/events/{poison}"' in await page.text()
    async with http.get(relay.admin_url + "/metrics") as answer:
        metrics = await answer.text()
    assert 'relay_deliveries_failing{route="leads",target="crm"} 1' in metrics
    cli = write_config(
        tmp_path / "cli.toml",
        {"storage": {"path": str(tmp_path / "relay.db")}, "targets": targets, "routes": ROUTES},
    )
    listed = relay_cli("events", "--failing", "--json", "--config", str(cli)).stdout
    assert [e["id"] for e in json.loads(listed)] == [str(poison)]
    async with http.get(relay.admin_url + "/api/v1/events?failing=6") as answer:
        assert (await answer.json())["events"] == []

    # Said once: its next failures, across a restart, say nothing more.
    await relay.stop()
    relay = await start_relay(config, background=False, clock=clock)
    n = await busy_until(clock.now() + 200, n)
    await relay.alerter.flush()
    assert len(await alerts(relay)) == 1
    detail = await relay.store.get_event(poison)
    assert detail is not None
    assert detail.event.deliveries[0].attempts_in_cycle == 7
    assert detail.event.deliveries[0].status is Status.PENDING


async def test_a_delivery_settled_before_the_alert_goes_is_not_said_to_keep_failing(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    """An alert says what to do now: one noted as failing and skipped (or
    delivered) within the alert's window is left out, and its commands too."""
    clock = FakeClock()
    _, url = await start_sink([500] * 5)
    targets = {"crm": {"type": "http", "url": url}, "ops": {"type": "file", "path": "ops.jsonl"}}
    relay = await start_relay(
        make_config(targets, ROUTES, alerts={"target": "ops"}), background=False, clock=clock
    )
    poison = await post(relay, 0, poison=True)
    for after in (0, 2, 4, 8, 16):
        clock.advance(after)
        await relay.scheduler.run_once()
        await relay.scheduler.wait_idle()
    detail = await relay.store.get_event(poison)
    assert detail is not None
    [delivery] = detail.event.deliveries
    assert delivery.attempts_in_cycle == 5  # noted: it keeps failing
    await relay.store.skip(delivery.id, clock.now(), by="cli user anna")
    assert await relay.alerter.flush() is None
    assert await alerts(relay) == []
