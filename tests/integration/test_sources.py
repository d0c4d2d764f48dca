"""Source profiles, each played with requests signed in the test by the provider's
published algorithm: accepted, wrong secret, tampered body, ping, duplicate, answer."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
from typing import Any

import aiohttp
import pytest

from relay.app import Relay
from relay.config import ConfigError
from relay.core.clock import FakeClock
from relay.ingress.listener import REJECTIONS_LOGGED_PER_SECOND
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory

TBANK_PASSWORD = "tbank-pass-1"
WOO_SECRET = "woo-secret-1"
TG_SECRET = "tg-secret-token-1"
WHSEC = "whsec_" + base64.b64encode(b"standard-webhooks-key-32-bytes!!").decode()
HMAC_SECRET = "gh-secret-1"
TILDA_KEY = "tilda-api-key-1"
GENERIC_TOKEN = "generic-token-1"
AUDIT = {"audit": {"type": "file", "path": "audit.jsonl"}}


def route(path: str, **options: Any) -> dict[str, Any]:
    return {"path": path, "targets": ["audit"], **options}


ROUTES = {
    "tilda": route("/tilda", source="tilda", api_key=TILDA_KEY),
    "tilda_open": route("/tilda-open", source="tilda"),
    "tbank": route("/tbank", source="tbank", password=["old-pass", TBANK_PASSWORD]),
    "woo": route("/woo", source="woocommerce", secret=WOO_SECRET),
    "telegram": route("/tg", source="telegram", secret_token=TG_SECRET),
    "cdek": route("/cdek/s3cr3t-path", source="cdek", allow_ips=["10.1.0.0/16", "127.0.0.1"]),
    "standard": route("/std", source="standard-webhooks", secret=WHSEC, tolerance="5m"),
    "github": route(
        "/gh", source="hmac", header="X-Hub-Signature-256", prefix="sha256=", secret=HMAC_SECRET
    ),
    "b64": route(
        "/b64",
        source="hmac",
        header="X-Signature",
        algorithm="sha512",
        encoding="base64",
        secret=HMAC_SECRET,
    ),
    "generic": route("/generic", token=GENERIC_TOKEN),
    "override": route(
        "/override",
        source="tbank",
        password=TBANK_PASSWORD,
        idempotency_key="{{ json.OrderId }}",
        response={"status": 202, "body": "thanks", "content_type": "text/plain"},
    ),
}


@pytest.fixture
async def relay(make_config: ConfigFactory, start_relay: RelayFactory) -> Relay:
    return await start_relay(make_config(AUDIT, ROUTES), background=False, clock=FakeClock())


async def send(
    http: aiohttp.ClientSession,
    relay: Relay,
    path: str,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, str]:
    async with http.post(relay.ingress_url + path, data=body, headers=headers or {}) as r:
        return r.status, await r.read(), r.headers.get("Content-Type", "")


async def stored(relay: Relay, route: str) -> list[Any]:
    return await relay.store.list_events(EventQuery(route=route))


# T-Bank: root fields except Token and nested objects, plus Password, sorted by
# name, values concatenated (booleans as true/false), SHA-256 hex.
def tbank_sign(payload: dict[str, Any], password: str) -> dict[str, Any]:
    flat = {k: v for k, v in payload.items() if not isinstance(v, dict | list)}
    flat["Password"] = password
    text = "".join(
        ("true" if flat[k] else "false") if isinstance(flat[k], bool) else str(flat[k])
        for k in sorted(flat)
    )
    return {**payload, "Token": hashlib.sha256(text.encode()).hexdigest()}


TBANK = {
    "TerminalKey": "1321054611234DEMO",
    "OrderId": "201709",
    "Success": True,
    "Status": "CONFIRMED",
    "PaymentId": 8742591,
    "ErrorCode": "0",
    "Amount": 19200,
    "CardId": 322264,
    "Pan": "430000******0777",
    "ExpDate": "1122",
    "Data": {"Phone": "+71234567890"},
}


async def test_tbank(relay: Relay, http: aiohttp.ClientSession) -> None:
    body = json.dumps(tbank_sign(TBANK, TBANK_PASSWORD)).encode()
    assert await send(http, relay, "/tbank", body) == (200, b"OK", "text/plain")
    assert await send(http, relay, "/tbank", body) == (200, b"OK", "text/plain")  # resent
    [event] = await stored(relay, "tbank")
    token = tbank_sign(TBANK, TBANK_PASSWORD)["Token"]
    assert event.idempotency_key == f"8742591:CONFIRMED:{token}"
    old = json.dumps(tbank_sign(TBANK, "old-pass")).encode()  # rotation: the old one still works
    assert (await send(http, relay, "/tbank", old))[0] == 200  # (another Token: another event)
    wrong = json.dumps(tbank_sign(TBANK, "guess")).encode()
    assert (await send(http, relay, "/tbank", wrong))[0] == 401
    tampered = json.dumps({**tbank_sign(TBANK, TBANK_PASSWORD), "Amount": 1}).encode()
    assert (await send(http, relay, "/tbank", tampered))[0] == 401
    assert len(await stored(relay, "tbank")) == 2
    assert relay.config.routes["tbank"].dedup_window == 30 * 86400  # T-Bank resends for a month


async def test_tilda(relay: Relay, http: aiohttp.ClientSession) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert await send(http, relay, "/tilda", b"test=test", form) == (200, b"ok", "text/plain")
    assert await send(http, relay, "/tilda-open", b"test=test", form) == (200, b"ok", "text/plain")
    lead = b"name=Anna&formid=form1&tranid=1234:5678"
    keyed = {**form, "X-Tilda-Api-Key": TILDA_KEY}
    assert await send(http, relay, "/tilda", lead, keyed) == (200, b"ok", "text/plain")
    other_lead = b"name=Boris&formid=form1&tranid=1234:5679&api_key=" + TILDA_KEY.encode()
    assert (await send(http, relay, "/tilda", other_lead, form))[0] == 200  # the key as a field
    assert (await send(http, relay, "/tilda", lead, {**form, "X-Tilda-Api-Key": "nope"}))[0] == 401
    assert (await send(http, relay, "/tilda", lead, form))[0] == 401
    keys = sorted(event.idempotency_key for event in await stored(relay, "tilda"))
    assert keys == ["1234:5678", "1234:5679"]
    assert await stored(relay, "tilda_open") == []  # the ping stored nothing


def woo_signature(body: bytes, secret: str = WOO_SECRET) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


async def test_woocommerce(relay: Relay, http: aiohttp.ClientSession) -> None:
    ping = await send(
        http, relay, "/woo", b"webhook_id=15", {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert ping[0] == 200
    order = json.dumps(
        {"id": 77, "status": "processing", "date_modified_gmt": "2026-12-01T10:00:00"}
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "X-WC-Webhook-Topic": "order.updated",
        "X-WC-Webhook-Signature": woo_signature(order),
        "X-WC-Webhook-Delivery-ID": "d41d8cd98f",
    }
    assert (await send(http, relay, "/woo", order, headers))[0] == 200
    assert (await send(http, relay, "/woo", order, headers))[0] == 200
    no_delivery_id = {k: v for k, v in headers.items() if k != "X-WC-Webhook-Delivery-ID"}
    assert (await send(http, relay, "/woo", order, no_delivery_id))[0] == 200
    bad = {**headers, "X-WC-Webhook-Signature": woo_signature(order, "guess")}
    assert (await send(http, relay, "/woo", order, bad))[0] == 401
    assert (await send(http, relay, "/woo", order + b" ", headers))[0] == 401
    # One order, one modification: one event, whatever the Delivery-ID says.
    keys = sorted(e.idempotency_key for e in await stored(relay, "woo"))
    assert keys == ["wc::order.updated:77:2026-12-01T10:00:00"]


async def test_telegram(relay: Relay, http: aiohttp.ClientSession) -> None:
    update = json.dumps({"update_id": 9001, "message": {"text": "hi"}}).encode()
    good = {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET, "Content-Type": "application/json"}
    assert await send(http, relay, "/tg", update, good) == (200, b"", "text/plain")
    assert (await send(http, relay, "/tg", update, good))[0] == 200
    assert (await send(http, relay, "/tg", update, {"X-Telegram-Bot-Api-Secret-Token": "nope"}))[
        0
    ] == 401
    assert (await send(http, relay, "/tg", update))[0] == 401
    [event] = await stored(relay, "telegram")
    assert event.idempotency_key == "9001"


async def test_cdek_and_ip_allow_list(relay: Relay, http: aiohttp.ClientSession) -> None:
    status = json.dumps(
        {
            "type": "ORDER_STATUS",
            "uuid": "72753031-3c87",
            "attributes": {"code": "DELIVERED", "status_date_time": "2026-12-01T10:00:00+0300"},
        }
    ).encode()
    assert (await send(http, relay, "/cdek/s3cr3t-path", status))[0] == 200
    assert (await send(http, relay, "/cdek/s3cr3t-path", status))[0] == 200
    [event] = await stored(relay, "cdek")
    assert event.idempotency_key == "72753031-3c87:DELIVERED:2026-12-01T10:00:00+0300"
    assert (await send(http, relay, "/cdek/guess", status))[0] == 404


async def test_ip_allow_list_behind_a_trusted_proxy(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    routes = {"cdek": route("/cdek", source="cdek", allow_ips=["10.1.0.0/16"])}
    plain = await start_relay(make_config(AUDIT, routes), background=False)
    # Without a trusted proxy, X-Forwarded-For proves nothing: the peer (127.0.0.1) counts.
    forged = {"X-Forwarded-For": "10.1.2.3"}
    assert (await send(http, plain, "/cdek", b"{}", forged))[0] == 403
    await plain.stop()
    behind = await start_relay(
        make_config(AUDIT, routes, server={"trusted_proxies": ["127.0.0.1/32"]}), background=False
    )
    assert (await send(http, behind, "/cdek", b"{}", {"X-Forwarded-For": "10.1.2.3"}))[0] == 200
    # The right-most untrusted hop is the client; what the client wrote further left is ignored.
    spoofed = {"X-Forwarded-For": "10.1.2.3, 203.0.113.9"}
    assert (await send(http, behind, "/cdek", b"{}", spoofed))[0] == 403
    [event] = await behind.store.list_events(EventQuery())
    assert event.remote_addr == "10.1.2.3"


def standard_headers(
    body: bytes, at: float, webhook_id: str = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", secret: str = WHSEC
) -> dict[str, str]:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    timestamp = str(int(at))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": f"v1,bm9wZQ== v1,{signature}",
    }


async def test_standard_webhooks(relay: Relay, http: aiohttp.ClientSession) -> None:
    now = relay.clock.now()
    body = b'{"type": "invoice.paid"}'
    assert (await send(http, relay, "/std", body, standard_headers(body, now - 60)))[0] == 200
    assert (await send(http, relay, "/std", body, standard_headers(body, now - 30)))[0] == 200
    assert len(await stored(relay, "standard")) == 1  # a replayed webhook-id is not applied twice
    stale = standard_headers(body, now - 600, webhook_id="msg_old")
    assert (await send(http, relay, "/std", body, stale))[0] == 401
    future = standard_headers(body, now + 600, webhook_id="msg_future")
    assert (await send(http, relay, "/std", body, future))[0] == 401
    wrong = standard_headers(
        body, now, webhook_id="msg_x", secret="whsec_" + base64.b64encode(b"another").decode()
    )
    assert (await send(http, relay, "/std", body, wrong))[0] == 401
    tampered = standard_headers(body, now, webhook_id="msg_y")
    assert (await send(http, relay, "/std", body + b" ", tampered))[0] == 401
    truncated = standard_headers(body, now, webhook_id="msg_z")
    truncated["webhook-signature"] = truncated["webhook-signature"][:-8]
    assert (await send(http, relay, "/std", body, truncated))[0] == 401


async def test_generic_hmac_and_token(relay: Relay, http: aiohttp.ClientSession) -> None:
    body = b'{"action": "opened"}'
    digest = hmac.new(HMAC_SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert (await send(http, relay, "/gh", body, {"X-Hub-Signature-256": f"sha256={digest}"}))[
        0
    ] == 200
    assert (await send(http, relay, "/gh", body, {"X-Hub-Signature-256": digest}))[0] == 401
    sha1 = hmac.new(HMAC_SECRET.encode(), body, hashlib.sha1).hexdigest()  # another algorithm
    assert (await send(http, relay, "/gh", body, {"X-Hub-Signature-256": f"sha256={sha1}"}))[
        0
    ] == 401
    b64 = base64.b64encode(hmac.new(HMAC_SECRET.encode(), body, hashlib.sha512).digest()).decode()
    assert (await send(http, relay, "/b64", body, {"X-Signature": b64}))[0] == 200
    assert (await send(http, relay, "/generic", body, {"X-Relay-Token": GENERIC_TOKEN}))[0] == 200
    async with http.post(f"{relay.ingress_url}/generic?token={GENERIC_TOKEN}", data=body) as r:
        assert r.status == 200
    assert (await send(http, relay, "/generic", body, {"X-Relay-Token": "nope"}))[0] == 401
    assert (await send(http, relay, "/generic", body))[0] == 401


async def test_overrides_for_key_and_answer(relay: Relay, http: aiohttp.ClientSession) -> None:
    body = json.dumps(tbank_sign(TBANK, TBANK_PASSWORD)).encode()
    assert await send(http, relay, "/override", body) == (202, b"thanks", "text/plain")
    [event] = await stored(relay, "override")
    assert event.idempotency_key == "201709"


async def test_rejections_are_kept_and_counted(relay: Relay, http: aiohttp.ClientSession) -> None:
    for _ in range(3):
        await send(http, relay, "/tg", b"{}", {"X-Telegram-Bot-Api-Secret-Token": "guess-123"})
    await relay.ingress.close()  # rejections are written in the background
    found = await relay.store.list_rejections("telegram", 10)
    assert [r.reason for r in found] == ["bad_token"] * 3
    assert found[0].remote_addr == "127.0.0.1"
    headers = dict(found[0].headers)
    assert headers["X-Telegram-Bot-Api-Secret-Token"] == "***"  # masked, by name
    text = relay.metrics.render().decode()
    assert 'relay_rejected_total{reason="bad_token",route="telegram"} 3.0' in text
    assert 'relay_events_received_total{result="rejected",route="telegram"} 3.0' in text


async def test_a_flood_of_forged_requests_is_counted_and_logged_within_a_limit(
    relay: Relay, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # Each refusal was a WARNING line: a few thousand forged requests a second
    # exhaust journald's rate limit, and relay's own attempt lines go with them.
    caplog.set_level(logging.WARNING, logger="relay.ingress")
    secret = {"X-Telegram-Bot-Api-Secret-Token": "guess-123"}
    await asyncio.gather(*(send(http, relay, "/tg", b"{}", secret) for _ in range(60)))
    lines = [r.getMessage() for r in caplog.records if "refused a request" in r.getMessage()]
    # At most REJECTIONS_LOGGED_PER_SECOND a second (the burst may straddle two).
    assert 1 <= len(lines) <= 2 * REJECTIONS_LOGGED_PER_SECOND
    text = relay.metrics.render().decode()
    assert 'relay_rejected_total{reason="bad_token",route="telegram"} 60.0' in text
    await asyncio.sleep(1.1)
    caplog.clear()
    await send(http, relay, "/tg", b"{}", secret)
    [line] = [r.getMessage() for r in caplog.records if "refused a request" in r.getMessage()]
    assert f"({60 - len(lines)} more refused on this route, not logged)" in line


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"source": "tbank"}, "routes.r.password: is required"),
        ({"source": "woocommerce", "secret": WOO_SECRET, "colour": 1}, "routes.r.colour: unknown"),
        ({"source": "telegram", "secret": "x"}, "routes.r.secret_token: is required"),
        ({"source": "paypal"}, 'routes.r.source: expected one of "generic"'),
        ({"source": "hmac", "secret": "x"}, "routes.r.header: is required"),
        (
            {"source": "hmac", "header": "X", "secret": "x", "algorithm": "md5"},
            'routes.r.algorithm: expected one of "sha1"',
        ),
        (
            {"source": "standard-webhooks", "secret": "whsec_***"},
            "routes.r.secret: expected a secret",
        ),
        ({"allow_ips": ["10.0.0.0/33"]}, "routes.r.allow_ips[0]: expected an address"),
        ({"response": {"status": 500}}, "routes.r.response.status: expected an integer from 200"),
    ],
)
def test_profile_options_are_checked(
    make_config: ConfigFactory, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(AUDIT, {"r": route("/r", **options)})
    assert message in str(caught.value)
