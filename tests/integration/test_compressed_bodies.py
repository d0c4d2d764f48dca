"""Bodies sent with Content-Encoding: stored whole (inflated) or refused, never cut.

Before: aiohttp inflated the stream and relay read Content-Length bytes of it,
so a 5,023-byte JSON sent gzipped (67 bytes) was stored as its first 67 bytes
and acknowledged "queued".
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import hmac
import zlib

import aiohttp
import orjson

from relay.app import Relay
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory

SECRET = "whsec-test"
TARGETS = {"audit": {"type": "file", "path": "out.jsonl"}}
ROUTES = {
    "orders": {"path": "/orders", "targets": ["audit"], "max_body_size": "64KiB"},
    "signed": {
        "path": "/signed",
        "targets": ["audit"],
        "source": "hmac",
        "secret": SECRET,
        "header": "X-Signature",
    },
}
PAYLOAD = orjson.dumps({"order": 7, "items": [{"sku": f"sku-{i}", "qty": i} for i in range(200)]})


async def start(make_config: ConfigFactory, start_relay: RelayFactory) -> Relay:
    return await start_relay(make_config(TARGETS, ROUTES), background=False)


async def post(
    http: aiohttp.ClientSession, relay: Relay, path: str, body: bytes, **headers: str
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **headers}
    async with http.post(relay.ingress_url + path, data=body, headers=headers) as response:
        return response.status, await response.read()


async def test_gzip_and_deflate_bodies_are_stored_whole(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start(make_config, start_relay)
    assert len(PAYLOAD) > 5000
    bodies = {
        "gzip": gzip.compress(PAYLOAD),
        "deflate": zlib.compress(PAYLOAD),  # RFC 9110: the zlib format
        "x-gzip": gzip.compress(PAYLOAD),
    }
    for coding, compressed in bodies.items():
        status, _ = await post(http, relay, "/orders", compressed, **{"Content-Encoding": coding})
        assert status == 200, coding
    # aiohttp's own client compressing a chunked request body, as a real sender would.
    async with http.post(relay.ingress_url + "/orders", data=PAYLOAD, compress="gzip") as response:
        assert response.status == 200
    events = await relay.store.list_events(EventQuery())
    assert len(events) == 4
    for event in events:
        detail = await relay.store.get_event(event.id)
        assert detail is not None
        assert detail.payload.body == PAYLOAD


async def test_signature_is_checked_over_the_inflated_body(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start(make_config, start_relay)
    signature = hmac.new(SECRET.encode(), PAYLOAD, hashlib.sha256).hexdigest()
    status, _ = await post(
        http,
        relay,
        "/signed",
        gzip.compress(PAYLOAD),
        **{"Content-Encoding": "gzip", "X-Signature": signature},
    )
    assert status == 200
    compressed = gzip.compress(PAYLOAD)
    signed_compressed = hmac.new(SECRET.encode(), compressed, hashlib.sha256).hexdigest()
    status, _ = await post(
        http,
        relay,
        "/signed",
        compressed,
        **{"Content-Encoding": "gzip", "X-Signature": signed_compressed},
    )
    assert status == 401


async def test_bomb_corrupt_and_unknown_codings_are_refused(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start(make_config, start_relay)
    bomb = gzip.compress(b"\x00" * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB in ~64 KiB
    assert len(bomb) < 64 * 1024
    status, answer = await post(http, relay, "/orders", bomb, **{"Content-Encoding": "gzip"})
    assert status == 413
    assert b"65536 bytes" in answer  # the limit applies to the inflated size
    truncated = gzip.compress(PAYLOAD)[:-20]
    status, _ = await post(http, relay, "/orders", truncated, **{"Content-Encoding": "gzip"})
    assert status == 400
    async with http.post(
        relay.ingress_url + "/orders", data=b"xx", headers={"Content-Encoding": "br"}
    ) as response:
        assert response.status == 415
        assert response.headers["Accept-Encoding"] == "gzip, deflate"
    stacked = gzip.compress(gzip.compress(PAYLOAD))
    status, _ = await post(http, relay, "/orders", stacked, **{"Content-Encoding": "gzip, gzip"})
    assert status == 415
    assert await relay.store.list_events(EventQuery()) == []


async def test_a_coding_in_a_second_header_line_counts(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    """Before: only the first Content-Encoding line was read: gzip twice on two
    lines was inflated once and stored still gzipped, and "identity" then "gzip"
    was stored compressed, both acknowledged 200. Two lines are one list (RFC
    9110 section 5.3), as "gzip, gzip" in one line is."""
    relay = await start(make_config, start_relay)
    host, port = relay.ingress_url.removeprefix("http://").split(":")
    once, twice = gzip.compress(PAYLOAD), gzip.compress(gzip.compress(PAYLOAD))
    for codings, body, status in (
        ((b"gzip", b"gzip"), twice, 415),
        ((b"identity", b"gzip"), once, 200),
        ((b"", b"gzip"), once, 200),
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        lines = b"".join(b"Content-Encoding: %s\r\n" % coding for coding in codings)
        writer.write(
            b"POST /orders HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s"
            % (lines, len(body), body)
        )
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 %d " % status), (codings, answer[:40])
    events = await relay.store.list_events(EventQuery())
    assert len(events) == 2
    for event in events:
        detail = await relay.store.get_event(event.id)
        assert detail is not None
        assert detail.payload.body == PAYLOAD  # never stored still compressed
