"""Ingress over real HTTP: answers, limits, keys, and never 200 for what is not on disk."""

from __future__ import annotations

import asyncio
import sqlite3

import aiohttp

from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory

TARGETS = {"audit": {"type": "file", "path": "out.jsonl"}}


def routes(**route: object) -> dict[str, object]:
    return {"orders": {"path": "/hooks/orders", "targets": ["audit"], **route}}


async def test_queued_then_duplicate(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    url = relay.ingress_url + "/hooks/orders"
    headers = {"Idempotency-Key": "order-1", "Content-Type": "application/json"}
    async with http.post(url, data=b'{"id": 1}', headers=headers) as response:
        assert response.status == 200
        first = await response.json()
    async with http.post(url, data=b'{"id": 1}', headers=headers) as response:
        assert response.status == 200
        second = await response.json()
    assert first["status"] == "queued"
    assert second == {"status": "duplicate", "id": first["id"]}
    events = await relay.store.list_events(EventQuery())
    assert len(events) == 1
    assert events[0].idempotency_key == "order-1"


async def test_body_headers_query_and_address_are_kept_as_sent(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    body = b'{"b": 1,   "a": "\xd0\xbf"}'  # spacing and key order must survive
    async with http.post(
        relay.ingress_url + "/hooks/orders?src=shop&x=1",
        data=body,
        headers={"Content-Type": "application/json; charset=utf-8", "X-Trace": "t1"},
    ) as response:
        event_id = int((await response.json())["id"])
    detail = await relay.store.get_event(event_id)
    assert detail is not None
    assert detail.payload.body == body
    assert detail.payload.query == "src=shop&x=1"
    assert ("X-Trace", "t1") in detail.payload.headers
    assert detail.payload.content_type == "application/json; charset=utf-8"
    assert detail.event.remote_addr == "127.0.0.1"


async def test_the_query_is_stored_as_sent_and_encoded_paths_find_their_route(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    host, port = relay.ingress_url.removeprefix("http://").split(":")
    query = b"phone=%2B79123456789&name=%D0%BF+q&a=b%26c"
    for target in (
        b"/hooks/orders?" + query,
        b"/hooks/%6Frders?" + query,  # percent-encoded path, as a client may write it
        b"http://" + host.encode() + b"/hooks/orders?" + query,  # absolute-form
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" % target)
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 "), (target, answer)
    events = await relay.store.list_events(EventQuery())
    assert len(events) == 3
    for event in events:
        detail = await relay.store.get_event(event.id)
        assert detail is not None
        assert detail.payload.query == query.decode()
        assert detail.payload.path == "/hooks/orders"
        assert detail.payload.query_fields == {
            "phone": "+79123456789",
            "name": "п q",
            "a": "b&c",
        }


async def test_unknown_path_wrong_method_and_oversized_body(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    config = make_config(TARGETS, routes(max_body_size="1KiB"))
    relay = await start_relay(config, background=False)
    base = relay.ingress_url
    async with http.post(base + "/hooks/nope", data=b"{}") as response:
        assert response.status == 404
    async with http.get(base + "/hooks/orders") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "POST"
    async with http.post(base + "/hooks/orders", data=b"x" * 1025) as response:
        assert response.status == 413

    async def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(10):
            yield b"x" * 512

    async with http.post(base + "/hooks/orders", data=chunks()) as response:
        assert response.status == 413
    async with http.post(base + "/hooks/orders", data=b"x" * 1024) as response:
        assert response.status == 200
    assert len(await relay.store.list_events(EventQuery())) == 1


async def test_answers_without_content_carry_none(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    """Before: a route answering 204 sent its configured body and a Content-Length,
    and HEAD got the 405's body: a client read those bytes as its next answer."""
    config = make_config(TARGETS, routes(response={"status": 204, "body": "OK"}))
    relay = await start_relay(config, background=False)
    host, port = relay.ingress_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    post = b"POST /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    writer.write(post + b"HEAD /hooks/orders HTTP/1.1\r\nHost: x\r\n\r\n" + post)
    heads = [await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3) for _ in range(3)]
    writer.close()
    assert [head[:12] for head in heads] == [b"HTTP/1.1 204", b"HTTP/1.1 405", b"HTTP/1.1 204"]
    assert b"Content-Length" not in heads[0]
    assert len(await relay.store.list_events(EventQuery())) == 2


async def test_bodies_refused_as_they_arrive_are_counted(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    """Before: relay.ingress.http1 answered a chunked body past the route's limit (413) and
    a body too slow (408) itself, and neither was counted: the too_large and
    timeout results of relay_events_received_total missed them."""
    config = make_config(TARGETS, routes(max_body_size="1KiB"), server={"read_timeout": "500ms"})
    relay = await start_relay(config, background=False)

    async def chunks():  # no Content-Length
        for _ in range(4):
            yield b"x" * 512

    async with http.post(relay.ingress_url + "/hooks/orders", data=chunks()) as response:
        assert response.status == 413
    host, port = relay.ingress_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
    assert (await asyncio.wait_for(reader.read(), 3)).startswith(b"HTTP/1.1 408 ")
    writer.close()
    text = relay.metrics.render().decode()
    assert 'relay_events_received_total{result="too_large",route="orders"} 1.0' in text
    assert 'relay_events_received_total{result="timeout",route="orders"} 1.0' in text


async def test_key_from_a_template_and_required_keys(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    config = make_config(
        TARGETS,
        routes(idempotency_key="{{ json.event.id }}", require_idempotency_key=True),
    )
    relay = await start_relay(config, background=False)
    url = relay.ingress_url + "/hooks/orders"
    async with http.post(url, json={"event": {"id": "evt_1"}}) as response:
        assert response.status == 200
    async with http.post(url, data=b'{"event":{"id":"evt_1"}}') as response:
        assert (await response.json())["status"] == "duplicate"  # the same JSON, resent
    async with http.post(url, json={"event": {}}) as response:
        assert response.status == 400
        assert "idempotency key" in (await response.json())["error"]
    async with http.post(url, data=b"not json") as response:
        assert response.status == 400
    [stored] = await relay.store.list_events(EventQuery())
    assert stored.idempotency_key == "evt_1"


async def test_default_key_headers_in_order(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    url = relay.ingress_url + "/hooks/orders"
    for headers in (
        {"X-Idempotency-Key": "a"},
        {"webhook-id": "b"},
        {"Idempotency-Key": "c", "webhook-id": "ignored"},
    ):
        async with http.post(url, data=b"{}", headers=headers) as response:
            assert response.status == 200
    keys = [e.idempotency_key for e in await relay.store.list_events(EventQuery())]
    assert keys == ["c", "b", "a"]


async def test_when_filter_skips_a_target(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    targets = {**TARGETS, "sales": {"type": "file", "path": "sales.jsonl"}}
    config = make_config(
        targets,
        {
            "orders": {
                "path": "/hooks/orders",
                "targets": ["audit", {"target": "sales", "when": "json.Status == 'CONFIRMED'"}],
            }
        },
    )
    relay = await start_relay(config, background=False)
    url = relay.ingress_url + "/hooks/orders"
    async with http.post(url, json={"Status": "NEW"}) as response:
        new_id = int((await response.json())["id"])
    async with http.post(url, json={"Status": "CONFIRMED"}) as response:
        confirmed_id = int((await response.json())["id"])
    new = await relay.store.get_event(new_id)
    confirmed = await relay.store.get_event(confirmed_id)
    assert new is not None
    assert confirmed is not None
    assert {d.target: d.status for d in new.event.deliveries} == {
        "audit": Status.PENDING,
        "sales": Status.SKIPPED,
    }
    assert "is false" in (new.event.deliveries[1].last_error or "")
    assert {d.status for d in confirmed.event.deliveries} == {Status.PENDING}


async def test_503_with_retry_after_when_the_database_cannot_be_written(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    config = make_config(TARGETS, routes(), storage={"busy_timeout": "200ms"})
    relay = await start_relay(config, background=False)
    url = relay.ingress_url + "/hooks/orders"
    locker = sqlite3.connect(config.storage.path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        async with http.post(url, data=b"{}", headers={"Idempotency-Key": "k"}) as response:
            assert response.status == 503
            assert int(response.headers["Retry-After"]) > 0
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert await relay.store.list_events(EventQuery()) == []
    async with http.post(url, data=b"{}", headers={"Idempotency-Key": "k"}) as response:
        assert response.status == 200  # recovered by itself
        assert (await response.json())["status"] == "queued"


async def test_503_when_the_disk_is_full(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start_relay(make_config(TARGETS, routes()), background=False)
    url = relay.ingress_url + "/hooks/orders"
    async with http.post(url, data=b"{}") as response:
        assert response.status == 200
    # SQLite's own size limit raises the same SQLITE_FULL error a full disk does.
    db = sqlite3.connect(relay.config.storage.path)
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.close()
    await relay.store._writer.run(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))
    statuses = []
    for _ in range(5):
        async with http.post(url, data=b"y" * 50_000) as response:
            statuses.append(response.status)
    assert statuses == [503] * 5
    await relay.store._writer.run(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
    async with http.post(url, data=b"y" * 50_000) as response:
        assert response.status == 200
    assert len(await relay.store.list_events(EventQuery())) == 2
