"""A key is not a payload: a stored key with other content is kept, flagged, counted.

Over real HTTP, against a real SQLite file: the sender posts, the admin API,
the CLI and the metrics report what relay did.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay.app import Relay
from relay.core.exact import key_bytes
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory
from helpers import arelay_cli, arelay_json, write_config

TOKEN = "admin-token-0123456789"
TARGETS = {"audit": {"type": "file", "path": "out.jsonl"}}


def routes(**route: object) -> dict[str, object]:
    return {"orders": {"path": "/hooks/orders", "targets": ["audit"], **route}}


async def post(
    http: aiohttp.ClientSession, relay: Relay, body: bytes, key: str = "order-1", **headers: str
) -> tuple[int, Any]:
    async with http.post(
        relay.ingress_url + "/hooks/orders",
        data=body,
        headers={"Idempotency-Key": key, "Content-Type": "application/json", **headers},
    ) as response:
        return response.status, await response.json()


async def conflicts_counted(http: aiohttp.ClientSession, relay: Relay) -> float:
    async with http.get(relay.admin_url + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith('relay_key_conflicts_total{route="orders"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_other_content_under_a_stored_key_is_stored_and_flagged(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = await start_relay(
        make_config(TARGETS, routes(), admin={"token": TOKEN}), background=False
    )
    status, first = await post(http, relay, b'{"order": 1, "total": 100}')
    assert (status, first["status"]) == (200, "queued")
    # Same notification, formatted differently: still a duplicate.
    status, again = await post(http, relay, b'{ "total":100 ,"order":1 }')
    assert (status, again) == (200, {"status": "duplicate", "id": first["id"]})
    with caplog.at_level(logging.WARNING, logger="relay.ingress"):
        status, other = await post(http, relay, b'{"order": 2, "total": 250}')
    assert (status, other["status"]) == (200, "queued")
    assert other["id"] != first["id"]
    assert f"already names event {first['id']}" in caplog.text
    # A re-send of the second order is a duplicate of the second order.
    status, other_again = await post(http, relay, b'{"order": 2, "total": 250}')
    assert other_again == {"status": "duplicate", "id": other["id"]}

    events = await relay.store.list_events(EventQuery())
    assert {e.id: e.conflict_of for e in events} == {
        int(first["id"]): None,
        int(other["id"]): int(first["id"]),
    }
    assert await conflicts_counted(http, relay) == 1
    async with http.get(
        relay.admin_url + f"/api/v1/events/{other['id']}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as response:
        shown = await response.json()
    assert shown["key_conflict_of"] == first["id"]
    assert shown["body"] == '{"order": 2, "total": 250}'


async def test_a_rejecting_route_answers_422_and_stores_nothing(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start_relay(make_config(TARGETS, routes(key_conflict="reject")), background=False)
    status, first = await post(http, relay, b'{"order": 1}')
    assert status == 200
    status, refused = await post(http, relay, b'{"order": 2}')
    assert status == 422
    assert f"already used for event {first['id']}" in refused["error"]
    status, again = await post(http, relay, b'{"order":1}')
    assert (status, again["status"]) == (200, "duplicate")
    assert len(await relay.store.list_events(EventQuery())) == 1
    assert await conflicts_counted(http, relay) == 1


async def test_form_fields_in_other_encoding_are_the_same_payload(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    _, first = await post(http, relay, b"Name=Anna+Li&Phone=%2B7999", **form)
    _, again = await post(http, relay, b"Name=Anna%20Li&Phone=%2B7999", **form)
    assert again == {"status": "duplicate", "id": first["id"]}
    # Field order is content for a form: a different order is another payload.
    _status, swapped = await post(http, relay, b"Phone=%2B7999&Name=Anna+Li", **form)
    assert swapped["status"] == "queued"


async def test_cli_lists_and_shows_the_conflict(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    config_data = {
        "server": {"listen": "127.0.0.1:0"},
        "storage": {"path": str(tmp_path / "relay.db")},
        "targets": TARGETS,
        "routes": routes(),
    }
    path = write_config(tmp_path / "relay.toml", config_data)
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    await post(http, relay, b'{"order": 1}')
    _, other = await post(http, relay, b'{"order": 2}')
    await relay.stop()
    listed = await arelay_json("events", "--config", str(path))
    by_id = {event["id"]: event for event in listed}
    assert by_id[other["id"]]["key_conflict_of"] is not None
    shown = (await arelay_cli("show", other["id"], "--config", str(path))).stdout
    assert "KEY CONFLICT: differs from event" in shown
    table = (await arelay_cli("events", "--config", str(path))).stdout
    assert "KEY CONFLICT" in table


async def raw_post(relay: Relay, path: str, key: bytes, body: bytes) -> bytes:
    """A request whose header bytes are not UTF-8, as a cp1251 sender writes them."""
    host, port = relay.ingress_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nIdempotency-Key: " + key + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    answer = await reader.read()
    writer.close()
    return answer


async def test_cp1251_header_keys_stay_two_keys(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    order = "заказ-1".encode("cp1251")
    item = "товар-1".encode("cp1251")
    first = await raw_post(relay, "/hooks/orders", order, b'{"n": 1}')
    second = await raw_post(relay, "/hooks/orders", item, b'{"n": 1}')  # same body, other key
    again = await raw_post(relay, "/hooks/orders", order, b'{"n": 1}')
    assert b'"status":"queued"' in first
    assert b'"status":"queued"' in second
    assert b'"status":"duplicate"' in again
    events = await relay.store.list_events(EventQuery())
    assert sorted(key_bytes(str(e.idempotency_key)) for e in events) == sorted([order, item])
    assert all(e.conflict_of is None for e in events)


async def test_template_keys_from_cp1251_query_values_stay_two_keys(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start_relay(
        make_config(TARGETS, routes(idempotency_key="{{ query.order }}")), background=False
    )
    url = relay.ingress_url + "/hooks/orders?order="
    for word in ("заказ-1", "товар-1"):  # percent-encoded cp1251, the same body
        quoted = "".join(f"%{byte:02X}" for byte in word.encode("cp1251"))
        async with http.post(url + quoted, data=b'{"n": 1}') as response:
            assert (await response.json())["status"] == "queued"
    events = await relay.store.list_events(EventQuery())
    keys = sorted(key_bytes(str(event.idempotency_key)) for event in events)
    assert keys == sorted(word.encode("cp1251") for word in ("заказ-1", "товар-1"))


def _percent(raw: bytes) -> bytes:
    return "".join(f"%{byte:02X}" for byte in raw).encode()


# Two order ids a cp1251 site sends, in every place a key can come from; each
# case builds (query, headers, body) for one id. The same body otherwise, so
# a key that folds both ids into one would answer the second "duplicate".
KEY_SOURCES = {
    "form percent-encoded": (
        "{{ form.order_id }}",
        lambda raw: (
            "",
            {"Content-Type": "application/x-www-form-urlencoded"},
            b"order_id=" + _percent(raw) + b"&n=1",
        ),
    ),
    "form raw bytes": (
        "{{ form.order_id }}",
        lambda raw: (
            "",
            {"Content-Type": "application/x-www-form-urlencoded"},
            b"order_id=" + raw + b"&n=1",
        ),
    ),
    "multipart": (
        "{{ form.order_id }}",
        lambda raw: (
            "",
            {"Content-Type": "multipart/form-data; boundary=B"},
            b'--B\r\nContent-Disposition: form-data; name="order_id"\r\n\r\n'
            + raw
            + b"\r\n--B--\r\n",
        ),
    ),
    "query": (
        "{{ query.order }}",
        lambda raw: ("order=" + _percent(raw).decode(), {}, b'{"n": 1}'),
    ),
    "raw body": ("{{ body }}", lambda raw: ("", {"Content-Type": "text/plain"}, raw)),
    "template over form and query": (
        "{{ query.shop }}/{{ form.order_id }}",
        lambda raw: (
            "shop=1",
            {"Content-Type": "application/x-www-form-urlencoded"},
            b"order_id=" + _percent(raw),
        ),
    ),
}


@pytest.mark.parametrize("source", list(KEY_SOURCES))
async def test_every_key_source_keeps_distinct_bytes_distinct(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    source: str,
) -> None:
    # Before: form fields were decoded with U+FFFD for each byte that is not
    # UTF-8, so `заказ-1` and `товар-1` both keyed "�����-1" and the second
    # order was answered "duplicate" and never delivered.
    template, build = KEY_SOURCES[source]
    relay = await start_relay(
        make_config(TARGETS, routes(idempotency_key=template)), background=False
    )
    ids = [word.encode("cp1251") for word in ("заказ-1", "товар-1")]
    for raw in [*ids, ids[0]]:
        query, headers, body = build(raw)
        url = relay.ingress_url + "/hooks/orders" + (f"?{query}" if query else "")
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == 200
    events = await relay.store.list_events(EventQuery())
    keys = [key_bytes(str(event.idempotency_key)) for event in events]
    assert len(keys) == 2, keys  # the third was the first again: a duplicate
    assert len(set(keys)) == 2
    assert all(ids[0].split(b"-")[0] in key or ids[1].split(b"-")[0] in key for key in keys)
