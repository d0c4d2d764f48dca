"""Connections and bodies that hold resources without sending: bounded in time and bytes.

Before: an ingress connection that sent nothing (or half a header) was held
60 s, an idle admin connection was never closed, and 300 stalled 1 MiB
uploads held 357 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
from aiohttp import web

from relay.admin.site import CappedSite
from relay.app import Relay
from relay.ingress.guard import HEAD_GRACE, QUIET_SECONDS
from relay.ingress.listener import BODIES_IN_FLIGHT

from conftest import ConfigFactory, RelayFactory

TARGETS = {"audit": {"type": "file", "path": "out.jsonl"}}
ROUTES = {"orders": {"path": "/orders", "targets": ["audit"]}}


async def start(make_config: ConfigFactory, start_relay: RelayFactory, timeout: str) -> Relay:
    config = make_config(TARGETS, ROUTES, server={"read_timeout": timeout})
    return await start_relay(config, background=False)


async def connect(
    url: str, source: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to `url`, from `source` (another loopback address: another
    client, as relay counts some limits per address) when given."""
    host, port = url.removeprefix("http://").split(":")
    local = (source, 0) if source is not None else None
    return await asyncio.open_connection(host, int(port), local_addr=local)


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


async def test_bodies_in_flight_past_the_bound_get_503_and_one_address_holds_half(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    """Stalled uploads are sent before any credential is checked: one address
    holds at most half the bound, so it cannot shut out other senders."""
    relay = await start(make_config, start_relay, "10s")
    declared = 1024 * 1024
    head = (
        b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % declared
    )  # and then nothing more: a stalled upload
    half = BODIES_IN_FLIGHT // declared // 2
    stalled = []

    async def stall(source: str) -> asyncio.StreamReader:
        reader, writer = await connect(relay.ingress_url, source)
        writer.write(head)
        stalled.append(writer)
        return reader

    async def answered(reader: asyncio.StreamReader, wait: float) -> bytes:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(reader.read(200), wait)
        return b""  # held: its body is awaited

    try:
        readers = [await stall("127.0.0.2") for _ in range(half)]
        past = await stall("127.0.0.2")
        assert (await answered(past, 2)).startswith(b"HTTP/1.1 503 ")  # past its half
        held = [await answered(reader, 0.001) for reader in readers]
        assert held == [b""] * half
        async with http.post(relay.ingress_url + "/orders", data=b"{}") as response:
            assert response.status == 200  # another sender still gets in
        for _ in range(half):
            await stall("127.0.0.3")
        async with http.post(relay.ingress_url + "/orders", data=b"x" * 1000) as response:
            assert response.status == 503  # the whole bound held
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
        second = await connect(url)  # just connected: neither quiet nor in a head
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


async def seconds_until_closed_while_trickling(url: str, head: bytes) -> float:
    """A head sent a byte every 0.1 s: never quiet, never complete."""
    reader, writer = await connect(url)
    started = time.monotonic()
    try:
        for byte in head:
            if reader.at_eof():
                break
            writer.write(bytes([byte]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(), 0.1)  # b"" once closed
    except ConnectionError:
        pass
    finally:
        writer.close()
    return time.monotonic() - started


async def test_a_trickled_head_is_closed_at_its_deadline_on_both_listeners(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    # The deadline is for the whole head, not for each byte: before, the admin
    # listener kept a head trickled a byte at a time for as long as it came.
    relay = await start(make_config, start_relay, "500ms")
    head = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 100
    waits = await asyncio.gather(
        seconds_until_closed_while_trickling(relay.ingress_url, head),
        seconds_until_closed_while_trickling(relay.admin_url, head),
    )
    for waited in waits:
        assert 0.4 < waited < 2.5, waits


async def capped(limit: int) -> tuple[web.ServerRunner, CappedSite, str]:
    async def hello(request: web.BaseRequest) -> web.Response:
        return web.Response(text="hello")

    runner = web.ServerRunner(web.Server(hello))
    await runner.setup()
    site = CappedSite(runner, "127.0.0.1", 0, limit=limit, name="test", probes=True)
    await site.start()
    return runner, site, f"http://127.0.0.1:{site.port}"


async def test_when_full_the_oldest_incomplete_head_makes_room() -> None:
    runner, _site, url = await capped(2)
    try:
        oldest = await connect(url)
        oldest[1].write(b"GET / HTTP/1.1\r\nX-A")  # never finished, never quiet
        await asyncio.sleep(HEAD_GRACE)
        newer = await connect(url)
        newer[1].write(b"GET / HTTP/1.1\r\nX-B")
        await asyncio.sleep(HEAD_GRACE + 0.05)
        for _, writer in (oldest, newer):
            writer.write(b"a")  # both still trickling: neither is quiet
        async with aiohttp.ClientSession() as http, http.get(url) as answer:
            assert await answer.text() == "hello"
        assert await asyncio.wait_for(oldest[0].read(), 2) == b""  # the oldest head went
        newer[1].write(b"a")
        assert not newer[0].at_eof()
    finally:
        for _, writer in (oldest, newer):
            writer.close()
        await runner.cleanup()


async def test_an_address_at_its_cap_closes_its_own_oldest_head_however_young() -> None:
    runner, site, url = await capped(2)
    try:
        oldest = await connect(url)
        oldest[1].write(b"POST / HTTP/1.1\r\nX-A")  # trickling, but for less than HEAD_GRACE
        await asyncio.sleep(0.02)
        newer = await connect(url)
        newer[1].write(b"POST / HTTP/1.1\r\nX-B")
        await asyncio.sleep(0.02)
        # Tricklers on one address that close each other's heads as they
        # reconnect keep every head younger than HEAD_GRACE: a prompt request
        # from that address is admitted all the same.
        async with aiohttp.ClientSession() as http, http.get(url) as answer:
            assert await answer.text() == "hello"
        assert await asyncio.wait_for(oldest[0].read(), 2) == b""  # the oldest head went
        newer[1].write(b"a")
        assert not newer[0].at_eof()
        assert site.cap is not None
        assert (site.cap.refused, site.cap.evicted) == (0, 1)
    finally:
        for _, writer in (oldest, newer):
            writer.close()
        await runner.cleanup()


async def test_a_health_probe_is_answered_with_every_slot_busy() -> None:
    release = asyncio.Event()

    async def handler(request: web.BaseRequest) -> web.Response:
        if request.path != "/healthz":
            await release.wait()  # busy in a request: never closed for room
        return web.Response(text="alive")

    runner = web.ServerRunner(web.Server(handler))
    await runner.setup()
    site = CappedSite(runner, "127.0.0.1", 0, limit=2, name="admin", probes=True)
    await site.start()
    url = f"http://127.0.0.1:{site.port}"
    busy = [await connect(url) for _ in range(2)]
    try:
        for _, writer in busy:
            writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.1)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            for _ in range(3):
                async with http.get(url + "/healthz") as answer:
                    assert (answer.status, await answer.text()) == (200, "alive")
            async with http.get(url + "/other") as answer:
                assert answer.status == 503  # only health probes go past the cap
        assert site.cap is not None
        await asyncio.sleep(0.5)
        assert len(site.cap._open) == 2  # the probes' connections closed once answered
    finally:
        release.set()
        for _, writer in busy:
            writer.close()
        await runner.cleanup()


async def test_one_address_holds_at_most_half_of_a_large_cap() -> None:
    runner, site, url = await capped(40)
    assert site.cap is not None
    assert site.cap.per_address == 20
    held = [await connect(url) for _ in range(25)]
    try:
        for _, writer in held:
            writer.write(b"GET / HTTP/1.1\r\nX-A")
        await asyncio.sleep(0.1)

        # 20 admitted; the 5 past the address's share were refused (when they
        # came, none of the 20 had begun a head or been quiet, so none could
        # make room): the other 20 slots stay free.
        async def answer(reader: asyncio.StreamReader) -> bytes:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(reader.read(), 0.3)
            return b""  # still held

        answers = await asyncio.gather(*(answer(reader) for reader, _ in held))
        assert sum(a.startswith(b"HTTP/1.1 503") for a in answers) == 5
    finally:
        for _, writer in held:
            writer.close()
        await runner.cleanup()
