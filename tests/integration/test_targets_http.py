"""The http target's bodies from templates: JSON, form (Bitrix24), templated headers."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.store import EventDetail

from conftest import TRANSPORTS, ConfigFactory, RelayFactory, SinkFactory

TILDA_FORM = "name=%D0%90%D0%BD%D0%BD%D0%B0&phone=%2B79990001122&formid=form1&tranid=77:1"


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs over each HTTP transport (tests/conftest.py)."""
    value: str = request.param
    return value


async def post_form(relay: Relay, http: aiohttp.ClientSession, body: str = TILDA_FORM) -> int:
    async with http.post(
        relay.ingress_url + "/hooks/lead",
        data=body.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    ) as r:
        assert r.status == 200
        return int((await r.json())["id"])


async def detail(relay: Relay, event_id: int) -> EventDetail:
    found = await relay.store.get_event(event_id)
    assert found is not None
    return found


ROUTES = {"lead": {"path": "/hooks/lead", "targets": ["crm"]}}


async def test_form_body_for_bitrix24(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([200])
    target = {
        "type": "http",
        "url": url,
        "format": "form",
        "form": {
            "fields[TITLE]": "Lead {{ form.name }}",
            "fields[PHONE][0][VALUE]": "{{ form.phone }}",
            "fields[SOURCE_DESCRIPTION]": "Tilda {{ form.formid }} / event {{ event.id }}",
        },
        "headers": {"X-Request-Id": "relay-{{ event.id }}"},
    }
    relay = await start_relay(
        make_config({"crm": target}, ROUTES), background=False, clock=FakeClock()
    )
    event_id = await post_form(relay, http)
    await relay.scheduler.drain()
    [request] = sink.requests
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert request.headers["X-Request-Id"] == f"relay-{event_id}"
    fields = parse_qs(request.body.decode())
    assert fields == {
        "fields[TITLE]": ["Lead Анна"],
        "fields[PHONE][0][VALUE]": ["+79990001122"],
        "fields[SOURCE_DESCRIPTION]": [f"Tilda form1 / event {event_id}"],
    }


async def test_json_body_and_bitrix_query_limit_is_a_retry(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    def bitrix(request: web.Request, number: int) -> web.StreamResponse:
        if number == 0:
            return web.json_response(
                {"error": "QUERY_LIMIT_EXCEEDED", "error_description": "Too many requests"},
                status=503,
            )
        return web.json_response({"result": 1})

    sink, url = await start_sink(bitrix)
    target = {
        "type": "http",
        "url": url,
        "format": "json",
        "body": '{"title": {{ ("Lead " ~ form.name) | tojson }}, "raw": {{ body | tojson }}}',
    }
    relay = await start_relay(
        make_config({"crm": target}, ROUTES), background=False, clock=FakeClock()
    )
    event_id = await post_form(relay, http)
    await relay.scheduler.drain()
    found = await detail(relay, event_id)
    [delivery] = found.event.deliveries
    first, _second = found.attempts[delivery.id]
    assert first.outcome == "retry"
    assert first.http_status == 503
    # The CRM's own reason, not only "HTTP 503", for the log, stats and alerts.
    assert first.error == "HTTP 503: Too many requests"
    assert b"QUERY_LIMIT_EXCEEDED" in first.response
    assert delivery.status.value == "delivered"
    sent = json.loads(sink.requests[1].body)
    assert sent == {"title": "Lead Анна", "raw": TILDA_FORM}
    assert sink.requests[1].headers["Content-Type"] == "application/json"


async def test_a_template_that_fails_makes_the_delivery_dead_without_retries(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([200])
    targets: dict[str, Any] = {
        "missing": {
            "type": "http",
            "url": url,
            "format": "json",
            "body": '{"email": "{{ form.email }}"}',
        },
        "broken": {
            "type": "http",
            "url": url,
            "format": "json",
            "body": '{"name": "{{ form.name }}",}',
        },
    }
    routes = {"lead": {"path": "/hooks/lead", "targets": ["missing", "broken"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())
    event_id = await post_form(relay, http)
    await relay.scheduler.drain()
    deliveries = {d.target: d for d in (await detail(relay, event_id)).event.deliveries}
    assert deliveries["missing"].status.value == "dead"
    assert deliveries["missing"].attempts == 1
    assert "email" in (deliveries["missing"].last_error or "")
    assert deliveries["broken"].status.value == "dead"
    assert "valid JSON" in (deliveries["broken"].last_error or "")
    assert sink.requests == []


async def test_multipart_forms_are_parsed_for_templates(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([200])
    target = {"type": "http", "url": url, "format": "form", "form": {"who": "{{ form.name }}"}}
    relay = await start_relay(
        make_config({"crm": target}, ROUTES), background=False, clock=FakeClock()
    )
    form = aiohttp.FormData()
    form.add_field("name", "Борис")
    form.add_field("cv", b"%PDF-1.4", filename="cv.pdf", content_type="application/pdf")
    async with http.post(relay.ingress_url + "/hooks/lead", data=form) as response:
        assert response.status == 200
    await relay.scheduler.drain()
    assert parse_qs(sink.requests[0].body.decode()) == {"who": ["Борис"]}


# RFC 9110 section 5.5: CR, LF and NUL are invalid in a field value; a
# recipient may reject the message, or cut the header at the NUL.
@pytest.mark.parametrize(
    ("name", "sent"), [("Anna%0D%0AX-Injected:%201", "Anna  X-Injected: 1"), ("Anna%00X", "Anna X")]
)
async def test_a_line_break_in_a_templated_header_is_never_sent_nor_the_delivery_lost(
    name: str,
    sent: str,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: aiohttp refused the header inside send(), relay recorded
    # "internal error", retried it for the whole 18-hour cycle with a traceback
    # each time, and each attempt counted toward the target's "failing" alert;
    # then the delivery was dead at once. Now the one rule for header values
    # (relay.targets.outbound.policy.sendable): a control character is a space.
    sink, url = await start_sink([200])
    targets = {"crm": {"type": "http", "url": url, "headers": {"X-Customer": "{{ form.name }}"}}}
    relay = await start_relay(
        make_config(targets, ROUTES, alerts={"failing_after": 1}),
        background=False,
        clock=FakeClock(),
    )
    event_id = await post_form(relay, http, f"name={name}&phone=1")
    await relay.scheduler.drain()
    [delivery] = (await detail(relay, event_id)).event.deliveries
    assert delivery.status.value == "delivered"
    [request] = sink.requests
    assert request.headers.getall("X-Customer") == [sent]
    assert "X-Injected" not in request.headers
    assert not [record for record in caplog.records if record.exc_info]
