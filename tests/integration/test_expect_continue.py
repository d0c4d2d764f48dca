"""`Expect: 100-continue`: answered at once, after the size check, so a sender
does not sit out its own timeout before sending the body (curl waited 1-5 s)."""

from __future__ import annotations

import asyncio

from relay.app import Relay
from relay.store import EventQuery

from conftest import ConfigFactory, RelayFactory

TARGETS = {"audit": {"type": "file", "path": "out.jsonl"}}
ROUTES = {"orders": {"path": "/orders", "targets": ["audit"], "max_body_size": "4KiB"}}


async def start(make_config: ConfigFactory, start_relay: RelayFactory) -> Relay:
    return await start_relay(make_config(TARGETS, ROUTES), background=False)


async def open_to(relay: Relay) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = relay.ingress_url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def head(length: int) -> bytes:
    return (
        b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % length
    )


async def test_continue_then_the_body_is_stored(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    relay = await start(make_config, start_relay)
    body = b'{"order": 1, "pad": "' + b"x" * 2000 + b'"}'
    reader, writer = await open_to(relay)
    try:
        writer.write(head(len(body)))
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert final.startswith(b"HTTP/1.1 200 ")
    finally:
        writer.close()
    [event] = await relay.store.list_events(EventQuery())
    detail = await relay.store.get_event(event.id)
    assert detail is not None
    assert detail.payload.body == body


async def test_too_large_is_refused_before_continue(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    relay = await start(make_config, start_relay)
    reader, writer = await open_to(relay)
    try:
        writer.write(head(10_000))
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1)
        assert answer.startswith(b"HTTP/1.1 413 ")  # no 100: the body is never sent
    finally:
        writer.close()


async def test_curl_does_not_wait(make_config: ConfigFactory, start_relay: RelayFactory) -> None:
    # curl waits `--expect100-timeout` for the interim answer (1 s by default) and
    # then sends the body anyway, so a relay that never answers 100 still gets a
    # 200 - only later. Stretching that wait to a minute makes a missing 100 a
    # wait no loaded machine can mistake for a slow fsync, and curl's own trace
    # says whether the 100 came.
    relay = await start(make_config, start_relay)
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-v", "-o", "/dev/null", "-w", "%{http_code}",
        "--expect100-timeout", "60",
        "-H", "Expect: 100-continue", "-H", "Content-Type: application/json",
        "--data-binary", '{"order": 2}', relay.ingress_url + "/orders",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        output, trace = await asyncio.wait_for(process.communicate(), 20)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError("curl still waited for 100 Continue after 20 s") from None
    assert output == b"200"
    assert b"< HTTP/1.1 100 Continue" in trace
