"""Alerts: dead deliveries and failing targets reach a person, grouped, without loops."""

from __future__ import annotations

import asyncio
import json
import re
import tomllib
from email import message_from_bytes
from email.message import Message
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiosmtpd.controller import Controller

from relay.background.alerts import ALERTS_ROUTE
from relay.core.clock import FakeClock
from relay.loader import parse_config
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import admin_credentials, free_port, post_events


async def test_many_dead_deliveries_make_one_alert(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    crm, crm_url = await start_sink([503])
    ops, ops_url = await start_sink([200])
    config = make_config(
        {
            "crm": {"type": "http", "url": crm_url, "concurrency": 16, "retry": {"retries": 0}},
            "ops": {"type": "http", "url": ops_url},
        },
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        alerts={"target": "ops", "failing_after": 3},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    await post_events(relay.ingress_url + "/hooks/orders", 500)
    await relay.scheduler.drain()
    await relay.alerter.flush()
    await relay.scheduler.drain()

    assert len(ops.requests) == 1
    alert = json.loads(ops.requests[0].body)
    assert ops.requests[0].headers["Content-Type"] == "application/json"
    assert alert["dead_count"] == 500
    assert len(alert["dead"]) == 50
    assert (
        alert["summary"]
        == "relay: 500 deliveries went dead; target crm for route orders is failing"
    )
    assert "relay requeue " in alert["text"]
    [failing] = alert["failing"]
    assert {k: failing[k] for k in ("target", "route", "failures", "error")} == {
        "target": "crm",
        "route": "orders",
        "failures": 3,
        "error": "HTTP 503",
    }
    assert re.fullmatch(r"answer \d+: 503", failing["answer"])  # the CRM's own words
    first = alert["dead"][0]
    assert first["route"] == "orders"
    assert first["target"] == "crm"
    assert "HTTP 503" in first["error"]

    crm.script = [200]
    async with http.post(relay.ingress_url + "/hooks/orders", data=b"{}") as response:
        assert response.status == 200
    await relay.scheduler.drain()
    await relay.alerter.flush()
    await relay.scheduler.drain()
    assert len(ops.requests) == 2
    recovered = json.loads(ops.requests[1].body)
    assert recovered["recovered"] == [{"target": "crm", "route": "orders", "failures_before": 500}]
    assert recovered["dead_count"] == 0


async def test_alerts_never_alert_about_themselves(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    _crm, crm_url = await start_sink([400])
    _ops, ops_url = await start_sink([500])  # the alert channel itself is broken
    config = make_config(
        {
            "crm": {"type": "http", "url": crm_url},
            "ops": {"type": "http", "url": ops_url, "retry": {"retries": 1}},
        },
        {"orders": {"path": "/hooks/orders", "targets": ["crm", "ops"]}},
        alerts={"target": "ops", "failing_after": 1},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    await post_events(relay.ingress_url + "/hooks/orders", 1)
    await relay.scheduler.drain()
    assert await relay.alerter.flush() is not None  # crm's dead delivery
    await relay.scheduler.drain()  # the alert fails twice and goes dead: no new alert
    assert await relay.alerter.flush() is None
    alerts = await relay.store.list_events(EventQuery(route=ALERTS_ROUTE))
    assert len(alerts) == 1
    assert alerts[0].deliveries[0].status.value == "dead"


async def test_the_group_window_runs_on_its_own(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    crm, crm_url = await start_sink([404])
    ops, ops_url = await start_sink([200])
    config = make_config(
        {"crm": {"type": "http", "url": crm_url}, "ops": {"type": "http", "url": ops_url}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        alerts={"target": "ops", "group_window": "150ms"},
    )
    relay = await start_relay(config, poll_interval=0.05)
    await post_events(relay.ingress_url + "/hooks/orders", 20)
    await crm.wait_for(20)
    await ops.wait_for(1)
    await asyncio.sleep(0.3)  # past two more windows: nothing more to say
    assert len(ops.requests) == 1
    assert json.loads(ops.requests[0].body)["dead_count"] == 20


async def test_alerts_to_telegram_use_the_alert_text(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    _crm, crm_url = await start_sink([400])
    bot, bot_url = await start_sink([200], path="")
    config = make_config(
        {
            "crm": {"type": "http", "url": crm_url},
            "ops": {
                "type": "telegram",
                "bot_token": "1:AAtoken",
                "chat_id": 5,
                "api_base": bot_url.rstrip("/"),
            },
        },
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        alerts={"target": "ops"},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    await post_events(relay.ingress_url + "/hooks/orders", 1)
    await relay.scheduler.drain()
    await relay.alerter.flush()
    await relay.scheduler.drain()
    [message] = bot.requests
    assert message.path == "/bot1:AAtoken/sendMessage"
    text = json.loads(message.body)["text"]
    assert text.startswith("relay: 1 delivery went dead\ndead: event 1 route orders → crm")
    # A 400 is about what the event says: a requeue would send the same bytes.
    assert "relay resend 1 --edit" in text
    assert "relay requeue" not in text


class _MailBox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


def _starter_with(crm_url: str, bot_url: str, smtp_port: int) -> dict[str, Any]:
    """`relay init`'s config as shipped, pointed at local servers."""
    data = tomllib.loads(resources.files("relay").joinpath("starter.toml").read_text())
    data["server"]["listen"] = "127.0.0.1:0"
    data["admin"]["listen"] = "127.0.0.1:0"
    data["targets"]["crm"]["url"] = crm_url
    data["targets"]["crm"]["retry"] = {"retries": 1, "unit": "1ms", "jitter": 0}
    data["targets"]["sales_chat"]["api_base"] = bot_url.rstrip("/")
    mail = data["targets"]["manager_mail"]
    mail.update(host="127.0.0.1", port=smtp_port, tls="none")
    del mail["username"], mail["password"]
    return data


async def test_an_alert_through_the_starters_lead_mail_says_what_went_dead(
    tmp_path: Path, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    crm, crm_url = await start_sink([503])
    _bot, bot_url = await start_sink([200], path="")
    box = _MailBox()
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        config = parse_config(
            _starter_with(crm_url, bot_url, port),
            {
                **admin_credentials(tmp_path / "credentials"),
                "TILDA_API_KEY": "tilda-key-1",
                "BITRIX_WEBHOOK_URL": "unused",
                "TELEGRAM_BOT_TOKEN": "1:AAtoken",
                "TELEGRAM_CHAT_ID": "-1001234567890",
                "SMTP_HOST": "unused",
                "SMTP_USER": "unused",
                "SMTP_PASSWORD": "unused",
                "MAIL_FROM": "relay@shop.example",
                "MAIL_TO": "manager@shop.example",
            },
            base=tmp_path,
        )
        relay = await start_relay(config, background=False, clock=FakeClock())
        async with aiohttp.ClientSession() as http:
            lead = "Name=Anna&Phone=%2B79001234567&api_key=tilda-key-1&tranid=1:1&formid=form1"
            async with http.post(
                relay.ingress_url + "/hooks/tilda",
                data=lead,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ) as response:
                assert response.status == 200
        await relay.scheduler.drain()
        assert len(crm.requests) == 2  # the first attempt and its one retry
        assert await relay.alerter.flush() is not None
        await relay.scheduler.drain()
        assert len(box.messages) == 2  # the lead's mail, then the alert
        alert = box.messages[1]
        assert alert["Subject"] == "relay: 1 delivery went dead"
        text = alert.get_payload(decode=True).decode()
        assert "dead: event 1 route tilda → crm after 2 attempts: HTTP 503" in text
        assert "once the target works again: relay requeue " in text  # retries ran out
        assert "relay resend" not in text
        assert "lead" not in str(alert["Subject"]).lower()

        # One more attempt by hand fails too: still dead, said so, not alerted again.
        [event] = await relay.store.list_events(EventQuery(route="tilda"))
        crm_delivery = next(d for d in event.deliveries if d.target == "crm")
        await relay.store.retry_now(crm_delivery.id, relay.clock.now())
        await relay.scheduler.drain()
        assert len(crm.requests) == 3
        assert await relay.alerter.flush() is None
        [event] = await relay.store.list_events(EventQuery(route="tilda"))
        crm_delivery = next(d for d in event.deliveries if d.target == "crm")
        assert crm_delivery.status.value == "dead"
        assert crm_delivery.attempts == 3
        assert "3 attempts in all" in (crm_delivery.last_error or "")
        assert "gave up after 2" not in (crm_delivery.last_error or "")
    finally:
        controller.stop()


async def test_a_route_failing_at_a_target_others_reach_does_not_flap_and_quotes_the_answer(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # The week's mapping incident: the CRM refused every Tilda lead (a bad
    # field) while WooCommerce orders to it went through; the alert said
    # "target crm recovered" and never quoted the CRM's answer.
    refusal = '{"error": "UF_CRM_PHONE: invalid value"}'

    async def crm(request: web.Request, number: int) -> web.StreamResponse:
        if "lead" in json.loads(await request.read()):
            return web.Response(status=422, text=refusal, content_type="application/json")
        return web.Response(text="ok")

    _, url = await start_sink(crm)
    ops, ops_url = await start_sink([200])
    config = make_config(
        {"crm": {"type": "http", "url": url}, "ops": {"type": "http", "url": ops_url}},
        {
            "tilda": {"path": "/hooks/tilda", "targets": ["crm"]},
            "woo": {"path": "/hooks/woo", "targets": ["crm"]},
        },
        alerts={"target": "ops", "failing_after": 3},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    # Three leads refused in a row, then an order through, a lead refused, an order.
    sequence = [("tilda", "lead")] * 3 + [("woo", "order"), ("tilda", "lead"), ("woo", "order")]
    for n, (route, field) in enumerate(sequence):
        async with http.post(f"{relay.ingress_url}/hooks/{route}", json={field: n}) as answer:
            assert answer.status == 200
        await relay.scheduler.drain()
    await relay.alerter.flush()
    await relay.scheduler.drain()

    [alert] = [json.loads(r.body) for r in ops.requests]
    assert alert["summary"] == (
        "relay: 4 deliveries went dead; target crm for route tilda is failing"
    )
    assert alert["recovered"] == []  # the orders delivered meanwhile say nothing of leads
    [failing] = alert["failing"]
    assert (failing["route"], failing["failures"], failing["answer"]) == ("tilda", 3, refusal)
    assert all(item["answer"] == refusal for item in alert["dead"])
    assert f"it answered: {refusal}" in alert["text"]
