"""What the senders really send, end to end over HTTP: from the sender's
documented payloads (tests/fixtures/<source>/SOURCE.md says where each comes
from) through relay to a real target that records what it receives."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay.app import Relay
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory, SinkFactory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WOO_SECRET = "woo-secret-1"
TBANK_PASSWORD = "tbank-pass-1"


def fixture(path: str) -> bytes:
    return (FIXTURES / path).read_bytes()


async def post(
    http: aiohttp.ClientSession, relay: Relay, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str]:
    async with http.post(relay.ingress_url + path, data=body, headers=headers) as response:
        return response.status, await response.text()


async def relay_to_sink(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    path: str,
    **route: Any,
) -> tuple[Relay, Any]:
    sink, url = await start_sink()
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"hooks": {"path": path, "targets": ["crm"], **route}},
    )
    return await start_relay(config), sink


def woo_headers(body: bytes, delivery_id: str, topic: str = "order.updated") -> dict[str, str]:
    """The headers WC_Webhook::deliver() sets (woocommerce includes/class-wc-webhook.php)."""
    signature = hmac.new(WOO_SECRET.encode(), body, hashlib.sha256).digest()
    resource, _, event = topic.partition(".")
    return {
        "Content-Type": "application/json",
        "User-Agent": "WooCommerce/9.4.2 Hookshot (WordPress/6.7.1)",
        "X-WC-Webhook-Source": "https://shop.example/",
        "X-WC-Webhook-Topic": topic,
        "X-WC-Webhook-Resource": resource,
        "X-WC-Webhook-Event": event,
        "X-WC-Webhook-Signature": base64.b64encode(signature).decode(),
        "X-WC-Webhook-ID": "15",
        "X-WC-Webhook-Delivery-ID": delivery_id,
    }


async def test_woocommerce_two_orders_in_one_second_are_both_delivered(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, sink = await relay_to_sink(
        make_config, start_relay, start_sink, "/woo", source="woocommerce", secret=WOO_SECRET
    )
    # wp_hash(webhook_id . strtotime('now')): one value for the whole second.
    same_second = hashlib.md5(b"151796800811").hexdigest()
    # WooCommerce sends trim(wp_json_encode($payload)): compact JSON.
    orders = [
        json.dumps(json.loads(fixture(f"woocommerce/order-{n}.json")), ensure_ascii=False)
        for n in (1, 2)
    ]
    for order in orders:
        body = order.encode()
        assert (await post(http, relay, "/woo", body, woo_headers(body, same_second)))[0] == 200
    await sink.wait_for(2)
    received = sorted(json.loads(r.body)["id"] for r in sink.requests)
    assert received == [727, 728]
    events = await relay.store.list_events(EventQuery())
    assert all(event.conflict_of is None for event in events)  # told apart by their keys


async def test_woocommerce_same_order_twice_is_one_delivery(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, sink = await relay_to_sink(
        make_config, start_relay, start_sink, "/woo", source="woocommerce", secret=WOO_SECRET
    )
    body = json.dumps(json.loads(fixture("woocommerce/order-1.json"))).encode()
    # The same order update queued twice (two hooks fired), a second apart.
    for delivery_id in ("a1", "b2"):
        assert (await post(http, relay, "/woo", body, woo_headers(body, delivery_id)))[0] == 200
    await sink.wait_for(1)
    assert len(await relay.store.list_events(EventQuery())) == 1


def woo_delivery_id(webhook_id: int, second: int) -> str:
    """WC_Webhook::get_new_delivery_id(): wp_hash( $this->get_id() . strtotime( 'now' ) ),
    and wp_hash() is hash_hmac( 'md5', $data, wp_salt() ) (wp-includes/pluggable.php)."""
    return hmac.new(b"example-wp-salt", f"{webhook_id}{second}".encode(), "md5").hexdigest()


async def test_woocommerce_deleted_restored_deleted_is_two_deliveries(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, sink = await relay_to_sink(
        make_config, start_relay, start_sink, "/woo", source="woocommerce", secret=WOO_SECRET
    )
    # WooCommerce never repeats a delivery: the same body twice, seconds
    # apart, is the order deleted twice (restored in between); the CRM must
    # hear of both, or it keeps an order the shop deleted.
    body = json.dumps(json.loads(fixture("woocommerce/order-deleted.json"))).encode()
    for second in (1796800811, 1796800874):
        headers = woo_headers(body, woo_delivery_id(15, second), "order.deleted")
        status, answer = await post(http, relay, "/woo", body, headers)
        assert status == 200
        assert json.loads(answer)["status"] == "queued"
    await sink.wait_for(2)
    assert [json.loads(r.body) for r in sink.requests] == [{"id": 104}, {"id": 104}]
    events = await relay.store.list_events(EventQuery())
    assert len(events) == 2
    assert all(event.conflict_of is None for event in events)  # two keys, not a conflict
    # The very same request again (a proxy's replay: WooCommerce has none) is one event still.
    headers = woo_headers(body, woo_delivery_id(15, 1796800874), "order.deleted")
    status, answer = await post(http, relay, "/woo", body, headers)
    assert status == 200
    assert json.loads(answer)["status"] == "duplicate"
    assert len(await relay.store.list_events(EventQuery())) == 2


async def test_woocommerce_action_topic_twice_is_two_deliveries(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, sink = await relay_to_sink(
        make_config, start_relay, start_sink, "/woo", source="woocommerce", secret=WOO_SECRET
    )
    # Order 105 completed, reopened, completed again: two "completed" actions.
    body = json.dumps(json.loads(fixture("woocommerce/action-order-completed.json"))).encode()
    topic = "action.woocommerce_order_status_completed"
    for second in (1796800811, 1796803020):
        headers = woo_headers(body, woo_delivery_id(15, second), topic)
        assert (await post(http, relay, "/woo", body, headers))[0] == 200
    await sink.wait_for(2)
    assert [json.loads(r.body)["arg"] for r in sink.requests] == [105, 105]


def tbank_signed(path: str, password: str = TBANK_PASSWORD) -> bytes:
    """The notification with its Token, by T-Bank's documented algorithm."""
    payload = json.loads(fixture(path))
    flat = {k: v for k, v in payload.items() if not isinstance(v, dict | list)}
    flat["Password"] = password
    text = "".join(
        ("true" if flat[k] else "false") if isinstance(flat[k], bool) else str(flat[k])
        for k in sorted(flat)
    )
    payload["Token"] = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps(payload).encode()


async def test_tbank_two_partial_refunds_are_two_events_and_a_resend_is_not(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, sink = await relay_to_sink(
        make_config, start_relay, start_sink, "/tbank", source="tbank", password=TBANK_PASSWORD
    )
    json_headers = {"Content-Type": "application/json"}
    first = tbank_signed("tbank/notification-partial-refund-1.json")
    second = tbank_signed("tbank/notification-partial-refund-2.json")
    assert await post(http, relay, "/tbank", first, json_headers) == (200, "OK")
    assert await post(http, relay, "/tbank", second, json_headers) == (200, "OK")
    await sink.wait_for(2)
    # T-Bank did not get OK in time and sends the first one again: OK, not delivered again.
    assert await post(http, relay, "/tbank", first, json_headers) == (200, "OK")
    await asyncio.sleep(0.2)
    assert sorted(json.loads(r.body)["Amount"] for r in sink.requests) == [3000, 5000]
    events = await relay.store.list_events(EventQuery())
    assert len(events) == 2
    assert all(event.conflict_of is None for event in events)  # distinct keys, not a conflict


@pytest.mark.parametrize("fixture", ["notification-qr.json", "notification-add-card.json"])
async def test_tbank_notifications_without_a_payment_id_are_keyed_by_their_request(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    fixture: str,
) -> None:
    # NotificationQr and NotificationAddCard carry no PaymentId: they had no
    # key, so each of T-Bank's re-sends (hourly for a day, then daily for a
    # month, until it gets OK) became an event delivered again.
    relay, sink = await relay_to_sink(
        make_config, start_relay, start_sink, "/tbank", source="tbank", password=TBANK_PASSWORD
    )
    notification = tbank_signed(f"tbank/{fixture}")
    for _ in range(3):
        answer = await post(
            http, relay, "/tbank", notification, {"Content-Type": "application/json"}
        )
        assert answer == (200, "OK")
    await sink.wait_for(1)
    [event] = await relay.store.list_events(EventQuery())
    assert event.idempotency_key is not None
    assert event.idempotency_key.startswith("13021e10-a3ed-4f14-bcd1-823b5ac37390:")
    await asyncio.sleep(0.2)
    assert len(sink.requests) == 1


async def test_tilda_json_webhook_test_request_and_lead(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, sink = await relay_to_sink(
        make_config, start_relay, start_sink, "/tilda", source="tilda"
    )
    json_headers = {"Content-Type": "application/json"}
    assert await post(http, relay, "/tilda", fixture("tilda/test.json"), json_headers) == (
        200,
        "ok",
    )
    assert await relay.store.list_events(EventQuery()) == []
    lead = fixture("tilda/lead.json")
    assert await post(http, relay, "/tilda", lead, json_headers) == (200, "ok")
    assert await post(http, relay, "/tilda", lead, json_headers) == (200, "ok")  # Tilda's retry
    await sink.wait_for(1)
    [event] = await relay.store.list_events(EventQuery())
    assert event.idempotency_key == "3516279:4213569"


async def test_cdek_status_without_attributes_code(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    relay, sink = await relay_to_sink(make_config, start_relay, start_sink, "/cdek", source="cdek")
    json_headers = {"Content-Type": "application/json"}
    for name in ("order-status.json", "order-status-legacy.json"):
        assert (await post(http, relay, "/cdek", fixture(f"cdek/{name}"), json_headers))[0] == 200
    await sink.wait_for(2)
    keys = sorted(str(e.idempotency_key) for e in await relay.store.list_events(EventQuery()))
    assert keys == [
        "72753031-3c87-4f4e-9c5f-3d2b5b4a1e01:4:2026-12-01T10:20:00+0300",
        "72753031-3c87-4f4e-9c5f-3d2b5b4a1e01:DELIVERED:2026-12-01T10:20:00+0300",
    ]
