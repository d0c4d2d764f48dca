"""Connections and bodies that hold resources without sending: bounded in time and bytes.

Before: an ingress connection that sent nothing (or half a header) was held
60 s, an idle admin connection was never closed, and 300 stalled 1 MiB
uploads held 357 MiB.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from relay.app import Relay
from relay.guard import QUIET_SECONDS, CappedSite
from relay.ingress import BODIES_IN_FLIGHT

from conftest import ConfigFactory, RelayFactory

TARGETS = {"audit": {"type": "file", "path": "out.jsonl"}}
ROUTES = {"orders": {"path": "/orders", "targets": ["audit"]}}


async def start(make_config: ConfigFactory, start_relay: RelayFactory, timeout: str) -> Relay:
    config = make_config(TARGETS, ROUTES, server={"read_timeout": timeout})
    return await start_relay(config, background=False)


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def seconds_until_closed(url: str, send: bytes) -> float:
    reader, writer = await connect(url)
    started = time.monotonic()
    writer.write(send)
    try:
        await asyncio.wait_for(reader.read(), 5)  # EOF when the server closes it
    finally:
        writer.close()
    return time.monotonic() - started


async def test_silent_and_half_header_connections_are_closed_on_both_listeners(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    relay = await start(make_config, start_relay, "500ms")
    waits = await asyncio.gather(
        seconds_until_closed(relay.ingress_url, b""),
        seconds_until_closed(relay.ingress_url, b"POST /orders HTTP/1.1\r\nHost: x\r\nX-A"),
        seconds_until_closed(relay.admin_url, b""),
        seconds_until_closed(relay.admin_url, b"GET /healthz HTTP/1.1\r\n"),
    )
    for waited in waits:
        assert 0.4 < waited < 2.5, waits


async def test_bodies_in_flight_past_the_bound_get_503(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    relay = await start(make_config, start_relay, "10s")
    declared = 1024 * 1024
    head = (
        b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % declared
    )  # and then nothing more: a stalled upload
    stalled = []
    for _ in range(BODIES_IN_FLIGHT // declared):
        _, writer = await connect(relay.ingress_url)
        writer.write(head)
        stalled.append(writer)
    await asyncio.sleep(0.2)
    try:
        async with http.post(relay.ingress_url + "/orders", data=b"x" * 1000) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "5"
    finally:
        for writer in stalled:
            writer.close()
    await asyncio.sleep(0.2)  # their bodies are released as the connections go
    async with http.post(relay.ingress_url + "/orders", data=b"{}") as response:
        assert response.status == 200


async def test_past_the_cap_the_quietest_connection_makes_room_or_the_new_one_gets_503() -> None:
    async def hello(request: web.BaseRequest) -> web.Response:
        return web.Response(text="hello")

    runner = web.ServerRunner(web.Server(hello))
    await runner.setup()
    site = CappedSite(runner, "127.0.0.1", 0, limit=2, name="test")
    await site.start()
    url = f"http://127.0.0.1:{site.port}"
    try:
        first = await connect(url)
        second = await connect(url)
        for _, writer in (first, second):
            writer.write(b"GET / HTTP/1.1\r\n")  # busy: sending a request right now
        await asyncio.sleep(0.05)
        reader, writer = await connect(url)
        refused = await asyncio.wait_for(reader.read(), 2)
        writer.close()
        assert refused.startswith(b"HTTP/1.1 503 ")
        assert b"Retry-After: 5" in refused
        await asyncio.sleep(QUIET_SECONDS + 0.1)  # now both are quiet
        async with (
            aiohttp.ClientSession() as http,
            http.get(url) as answer,
        ):
            assert await answer.text() == "hello"
        assert await asyncio.wait_for(first[0].read(), 2) == b""  # the quietest went
        assert site.cap is not None
        assert (site.cap.refused, site.cap.evicted) == (1, 1)
    finally:
        for _, writer in (first, second):
            writer.close()
        await runner.cleanup()


async def test_a_connection_whose_request_is_being_handled_is_never_closed_for_room() -> None:
    release = asyncio.Event()

    async def slow(request: web.BaseRequest) -> web.Response:
        await release.wait()  # as a request waiting for its commit
        return web.Response(text="stored")

    runner = web.ServerRunner(web.Server(slow))
    await runner.setup()
    site = CappedSite(runner, "127.0.0.1", 0, limit=2, name="test")
    await site.start()
    url = f"http://127.0.0.1:{site.port}"
    waiting_reader, waiting = await connect(url)
    idle_reader, idle = await connect(url)
    try:
        waiting.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(QUIET_SECONDS + 0.1)  # both quiet now; one is in a request
        _, newcomer = await connect(url)
        assert await asyncio.wait_for(idle_reader.read(), 2) == b""  # the idle one made room
        reader, writer = await connect(url)
        refused = await asyncio.wait_for(reader.read(), 2)
        writer.close()
        assert refused.startswith(b"HTTP/1.1 503 ")  # the one in a request was kept
        release.set()
        answer = await asyncio.wait_for(waiting_reader.readuntil(b"stored"), 2)
        assert answer.startswith(b"HTTP/1.1 200 ")
        newcomer.close()
    finally:
        release.set()
        for writer in (waiting, idle):
            writer.close()
        await runner.cleanup()
