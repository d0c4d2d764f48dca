"""relay.targets.outbound.client against real servers on 127.0.0.1: an aiohttp app (the
well-behaved server) and raw TCP servers that answer as RFC 9112 allows but
few do (1xx first, chunked, a body ending at the close). Each scenario runs
on asyncio's loop and on uvloop, which relay serves on: their transports and
create_connection differ."""

from __future__ import annotations

import asyncio
import base64
import itertools
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import trustme
import uvloop
from aiohttp import web

from relay.targets.outbound.client import Client, _origin, environment_proxy
from relay.targets.outbound.transport import (
    Answer,
    BadAnswer,
    ClientError,
    ConnectError,
    NoAnswer,
    ProxyError,
    RequestError,
    TLSError,
    TransportError,
)

from helpers import eventually

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}

Scenario = Callable[[], Coroutine[Any, Any, None]]


def on_both_loops(scenario: Scenario) -> Callable[[str], None]:
    @pytest.mark.parametrize("loop", list(LOOPS))
    def test(loop: str) -> None:
        LOOPS[loop](asyncio.wait_for(scenario(), 20))

    test.__name__ = scenario.__name__
    test.__doc__ = scenario.__doc__
    return test


class AppServer:
    """An aiohttp server that counts the connections it was asked on."""

    def __init__(
        self,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.tls = tls
        self.peers: set[tuple[str, int]] = set()
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> AppServer:
        async def handle(request: web.Request) -> web.StreamResponse:
            assert request.transport is not None
            self.peers.add(request.transport.get_extra_info("peername"))
            body = await request.read()
            self.requests.append((request.method, request.path_qs, dict(request.headers), body))
            return await self.handler(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app, keepalive_timeout=0.3)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


class RawServer:
    """Writes `answers[n]` to the n-th request on each connection, whatever it
    was (its head read, and its body by Content-Length). Past the last answer
    it closes the connection, or with `hold` keeps it open until the client
    closes it; with `repeat` the last answer is written to every later one."""

    def __init__(self, *answers: bytes, repeat: bool = False, hold: bool = False) -> None:
        self.answers = answers
        self.repeat = repeat
        self.hold = hold
        self.connections = 0
        self.url = ""
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> RawServer:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                for number in itertools.count():
                    if number >= len(self.answers) and not self.repeat:
                        break
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    await reader.readexactly(length)
                    writer.write(self.answers[min(number, len(self.answers) - 1)])
                    await writer.drain()
                if self.hold:
                    await reader.read()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()


async def answer_ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True}, headers={"Retry-After": "7"})


@on_both_loops
async def test_connections_are_kept_alive_and_reused() -> None:
    client = Client(keep=4)
    async with AppServer(answer_ok) as server:
        for n in range(5):
            answer = await client.request(
                "POST", f"{server.url}/hook?n={n}", {"X-N": str(n)}, b'{"n": 1}', keep=2048
            )
            assert answer.status == 200
            assert answer.excerpt == b'{"ok": true}'
            assert answer.headers["retry-after"] == "7"  # any case
        assert len(server.peers) == 1
        method, path, headers, body = server.requests[-1]
        assert (method, path, body) == ("POST", "/hook?n=4", b'{"n": 1}')
        assert headers["X-N"] == "4"
        assert headers["Host"] == server.url.removeprefix("http://")
        assert headers["Content-Length"] == "8"
        assert "Accept-Encoding" not in headers  # answers are kept as they come
    await client.close()


@on_both_loops
async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    """aiohttp closes a kept-alive connection after keepalive_timeout (0.3 s
    here): the next request goes out on a new one and succeeds."""
    client = Client(keep=4)
    async with AppServer(answer_ok) as server:
        assert (await client.request("POST", server.url, {}, b"1", keep=2048)).status == 200
        assert server.runner is not None
        web_server = server.runner.server
        assert web_server is not None

        async def closed() -> bool:  # by the server, idle past its keepalive_timeout
            return not web_server.connections

        await eventually(closed, timeout=5)
        assert (await client.request("POST", server.url, {}, b"2", keep=2048)).status == 200
        assert len(server.peers) == 2
    await client.close()


@on_both_loops
async def test_only_the_excerpt_is_read_and_that_connection_is_dropped() -> None:
    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=b"y" * 1_000_000)

    client = Client(keep=4)
    async with AppServer(huge) as server:
        answer = await client.request("POST", server.url, {}, b"", keep=2048)
        assert answer.status == 200
        assert answer.excerpt == b"y" * 2048
        # Not reused: the rest of that body was never read.
        await client.request("GET", server.url, {}, b"", keep=2048)
        assert len(server.peers) == 2
    await client.close()


@on_both_loops
async def test_informational_answers_before_the_real_one() -> None:
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nX-Id: 9\r\n\r\nok"
    )
    client = Client(keep=4)
    async with RawServer(raw, repeat=True) as server:
        answer = await client.request("POST", server.url, {}, b"x", keep=2048)
        assert (answer.status, answer.excerpt, answer.headers["X-Id"]) == (201, b"ok", "9")
        assert (await client.request("POST", server.url, {}, b"x", keep=2048)).status == 201
        assert server.connections == 1
    await client.close()


@on_both_loops
async def test_chunked_and_close_delimited_bodies() -> None:
    chunked = (
        b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"err\r\n10\r\nor": "no phone"}\r\n0\r\n\r\n'
    )
    client = Client(keep=4)
    async with RawServer(chunked, repeat=True) as server:
        answer = await client.request("POST", server.url, {}, b"x", keep=2048)
        assert (answer.status, answer.excerpt) == (400, b'{"error": "no phone"}')
    until_close = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 30\r\n\r\nbusy, later"
    async with RawServer(until_close) as server:
        answer = await client.request("POST", server.url, {}, b"x", keep=2048)
        assert (answer.status, answer.excerpt) == (503, b"busy, later")
    await client.close()


@on_both_loops
async def test_a_status_that_came_is_the_answer_even_if_the_body_was_cut() -> None:
    """The target said 200: calling it a failure would deliver it again."""
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"
    client = Client(keep=4)
    async with RawServer(cut) as server:
        answer = await client.request("POST", server.url, {}, b"x", keep=2048)
        assert (answer.status, answer.excerpt) == (200, b"partial")
    await client.close()


@on_both_loops
async def test_what_is_not_an_answer() -> None:
    client = Client(keep=4)
    async with RawServer(b"") as server:  # reads the request, closes, says nothing
        with pytest.raises(NoAnswer):
            await client.request("POST", server.url, {}, b"x", keep=2048)
    async with RawServer(b"SSH-2.0-OpenSSH_9.2\r\n") as server:
        with pytest.raises(BadAnswer):
            await client.request("POST", server.url, {}, b"x", keep=2048)
    with pytest.raises(ConnectError) as refused:
        await client.request("POST", "http://127.0.0.1:1/", {}, b"x", keep=2048)
    assert (refused.value.reason, refused.value.dns) == ("Connection refused", False)
    with pytest.raises(ConnectError) as unknown:
        await client.request("POST", "http://no-such-host.invalid/", {}, b"x", keep=2048)
    assert unknown.value.dns
    await client.close()


@on_both_loops
async def test_headers_as_given_and_those_that_cannot_be() -> None:
    client = Client(keep=4)
    async with AppServer(answer_ok) as server:
        port = server.url.rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}/v1"
        given = {"Host": "crm.example", "Content-Length": "999", "Accept": "application/json"}
        await client.request("PUT", url, given, b"abc", keep=2048)
        _, _, headers, body = server.requests[-1]
        assert headers["Host"] == "crm.example"  # a configured Host wins
        assert headers["Content-Length"] == "3"  # framing is worked out, never taken
        assert headers["Accept"] == "application/json"
        assert body == b"abc"
        for name, value in (("X-Evil", "a\r\nX-Injected: 1"), ("X-Bad\n", "v")):
            with pytest.raises(RequestError):
                await client.request("POST", server.url, {name: value}, b"", keep=2048)
        assert not any("X-Injected" in h for _, _, h, _ in server.requests)
    for unusable in ("ftp://127.0.0.1/", "http://[::1/", "http://127.0.0.1:99999/"):
        with pytest.raises(RequestError):
            await client.request("POST", unusable, {}, b"", keep=2048)
    await client.close()


@on_both_loops
async def test_a_cancelled_request_never_leaves_its_connection_for_the_next() -> None:
    """The scheduler's time limit cancels the wait: that connection may still
    bring the late answer, which must never be read as the next request's."""
    release = asyncio.Event()
    answered = 0

    async def slow_then_fast(request: web.Request) -> web.Response:
        nonlocal answered
        answered += 1
        if answered == 1:
            await release.wait()
            return web.Response(text="late")
        return web.Response(text="second")

    client = Client(keep=4)
    async with AppServer(slow_then_fast) as server:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.request("POST", server.url, {}, b"1", keep=2048)
        release.set()
        answer = await client.request("POST", server.url, {}, b"2", keep=2048)
        assert answer.excerpt == b"second"
        assert len(server.peers) == 2
    await client.close()


@on_both_loops
async def test_https_is_verified_and_kept_alive() -> None:
    ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(served)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    async with AppServer(answer_ok, tls=served) as server:
        # The system's certificates do not know this CA: refused, nothing sent.
        untrusting = Client(keep=4)
        with pytest.raises(TLSError, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusting.request("POST", server.url, {}, b"x", keep=2048)
        await untrusting.close()
        assert server.requests == []
        client = Client(keep=4, tls=trusting)
        for _ in range(3):
            assert (await client.request("POST", server.url, {}, b"x", keep=2048)).status == 200
        assert len(server.peers) == 1
        # The certificate names 127.0.0.1, not localhost: the name is checked too.
        wrong_name = server.url.replace("127.0.0.1", "localhost")
        with pytest.raises((TLSError, ConnectError)):
            await client.request("POST", wrong_name, {}, b"x", keep=2048)
        await client.close()


@on_both_loops
async def test_bytes_after_the_answer_are_never_the_next_requests_answer() -> None:
    """A server that answers twice (a framework's error page after the handler's
    answer): the start of the second, in the same packet as the first, must not
    be read as the answer to the next request sent on that connection."""
    answer_and_more = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    first = answer_and_more + b"HTTP/1.1 200 OK\r\nContent-Le"
    second = b"ngth: 5\r\n\r\nstale" + b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nreal"
    client = Client(keep=4)
    async with RawServer(first, second, hold=True) as server:
        answer = await client.request("POST", server.url, {}, b"1", keep=2048)
        assert (answer.status, answer.excerpt) == (200, b"ok")
        # A new connection, whose first answer is the script's first again.
        answer = await client.request("POST", server.url, {}, b"2", keep=2048)
        assert (answer.status, answer.excerpt) == (200, b"ok")
        assert server.connections == 2
    # A whole second answer in the same packet: that connection is not trusted either.
    twice = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" * 2
    async with RawServer(twice, twice, hold=True) as server:
        for _ in range(2):
            assert (await client.request("POST", server.url, {}, b"x", keep=2048)).status == 200
        assert server.connections == 2
    await client.close()


@on_both_loops
async def test_an_endless_head_is_refused_not_held_in_memory() -> None:
    """A hostile target that sends headers for ever, or one header that never
    ends: refused once past aiohttp's limits, not read until memory runs out."""

    async def endless(line: bytes, head: bytes = b"HTTP/1.1 200 OK\r\n") -> Answer | None:
        written = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal written
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(1)
            writer.write(head)
            try:
                for _ in range(20_000):  # 20 MB at most, if nothing stops it
                    writer.write(line * (1000 // len(line)))
                    await writer.drain()
                    written += 1
            except ConnectionError:
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = Client(keep=4)
        try:
            return await client.request("POST", f"http://127.0.0.1:{port}/", {}, b"x", keep=2048)
        except BadAnswer:
            return None
        finally:
            await client.close()
            server.close()
            await asyncio.sleep(0.1)
            # Dropped long before the end: not read (nor held) to the last byte.
            assert written < 10_000

    assert await endless(b"X-A: b\r\n") is None  # more headers than any answer has
    assert await endless(b"a") is None  # one header line that never ends
    assert await endless(b"HTTP/1.1 100 Continue\r\n\r\n") is None  # 1xx for ever
    # Trailers after a chunked body are held as headers are; the status came,
    # so it is the answer (see the garbled body's test), the trailers refused.
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: "
    answer = await endless(b"a", chunked)
    assert answer is not None
    assert (answer.status, answer.excerpt) == (200, b"ok")


@on_both_loops
async def test_a_status_that_came_is_the_answer_even_if_the_body_is_garbled() -> None:
    """As with a body cut short: the target said 200, and a chunk size llhttp
    cannot read after it must not make it a retry (a second delivery)."""
    garbled = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
    client = Client(keep=4)
    async with RawServer(garbled, repeat=True) as server:
        answer = await client.request("POST", server.url, {}, b"x", keep=2048)
        assert (answer.status, answer.excerpt) == (200, b"hello")
        # That connection is not reused: what follows on it cannot be read.
        assert (await client.request("POST", server.url, {}, b"x", keep=2048)).status == 200
        assert server.connections == 2
    await client.close()


@on_both_loops
async def test_https_to_a_name_written_with_its_final_dot() -> None:
    """https://crm.example./ (a fully qualified name, no search domain tried)
    worked with aiohttp, which checks the certificate for crm.example: the
    dot is no part of the name a certificate holds."""
    ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("relay.example").configure_cert(served)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    async with AppServer(answer_ok, tls=served) as server:
        port = int(server.url.rsplit(":", 1)[1])
        client = Client(keep=4, tls=trusting)
        # No DNS here for relay.example: its address put in the client's cache.
        loopback = await asyncio.get_running_loop().getaddrinfo(
            "127.0.0.1", port, type=socket.SOCK_STREAM
        )
        client._resolver._known[("relay.example.", port)] = (float("inf"), loopback)
        answer = await client.request("POST", f"https://relay.example.:{port}/", {}, b"x", keep=99)
        assert answer.status == 200
        await client.close()


@on_both_loops
async def test_an_address_in_the_url_is_connected_to_as_it_is() -> None:
    """No lookup for an IP literal (IPv6 in brackets too), and its Host header as written."""
    seen: list[str] = []

    async def host(request: web.Request) -> web.Response:
        seen.append(request.headers["Host"])
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/", host)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "::1", 0).start()
    except OSError:
        await runner.cleanup()
        pytest.skip("no IPv6 loopback here")
    port = runner.addresses[0][1]
    client = Client(keep=2)
    try:
        answer = await client.request("POST", f"http://[::1]:{port}/", {}, b"x", keep=2048)
        assert (answer.status, seen) == (200, [f"[::1]:{port}"])
        # A zone, written %25 as RFC 6874 section 2 says (here lo by its index,
        # 1): connected through that interface, and left out of Host, as
        # section 4 asks of a client (Go's net/http strips it too).
        lo = socket.if_nametoindex("lo")
        zoned = f"http://[::1%25{lo}]:{port}/"
        answer = await client.request("POST", zoned, {}, b"x", keep=2048)
        assert (answer.status, seen[1:]) == (200, [f"[::1]:{port}"])
        # (A loopback address ignores its zone: that a link-local one is
        # reached through the zone named, decoded, is the lookup's to show.)
        assert _origin("http://[fe80::1%25eth0]:8080/").host == "fe80::1%eth0"
    finally:
        await client.close()
        await runner.cleanup()


@on_both_loops
async def test_a_close_the_loop_has_not_read_yet_is_seen_before_reuse() -> None:
    """The server answers keep-alive and closes at once (an idle timeout met
    just then): its FIN is in the socket before the loop has dispatched it.
    The connection is looked at before it is reused, and nothing is sent on
    it: a POST without an idempotency key, which is never sent twice."""
    once = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    client = Client(keep=4)
    async with RawServer(once) as server:
        for _ in range(3):
            answer = await client.request("POST", server.url, {}, b"x", keep=2048)
            assert answer.status == 200
        assert server.connections == 3
    await client.close()


class ClosesOnSecond:
    """Answers a connection's first request, then reads the second and closes
    without a word: a server whose idle timeout fired as the request arrived
    (or that read it and died: from the client, the two look the same)."""

    def __init__(self, second: bytes = b"") -> None:
        self.second = second  # written before the close
        self.requests: list[bytes] = []
        self.url = ""
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> ClosesOnSecond:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                for number in range(2):
                    head = await reader.readuntil(b"\r\n\r\n")
                    self.requests.append(head.split(b"\r\n")[0])
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    await reader.readexactly(length)
                    if number == 0:
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    else:
                        writer.write(self.second)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()


@on_both_loops
async def test_a_stale_kept_alive_connection_is_retried_once_if_a_second_copy_is_harmless() -> None:
    """Before: the second request failed as NoAnswer, an attempt lost to the
    pool. Now it goes once more on a new connection, when nothing of an answer
    came and the request says a second copy is harmless: an Idempotency-Key
    (every http target's request has one; Go's net/http reads it so) or an
    idempotent method. A POST without one is not repeated."""
    keyed = {"Idempotency-Key": "order-1"}
    async with ClosesOnSecond() as server:
        client = Client(keep=4)
        assert (await client.request("POST", server.url, keyed, b"1", keep=99)).status == 200
        assert (await client.request("POST", server.url, keyed, b"2", keep=99)).status == 200
        # The second request twice: on the stale connection, then on a new one.
        assert server.requests == [b"POST / HTTP/1.1"] * 3
        assert (await client.request("GET", server.url, {}, b"", keep=99)).status == 200
        await client.close()
    async with ClosesOnSecond() as server:
        client = Client(keep=4)
        assert (await client.request("POST", server.url, {}, b"1", keep=99)).status == 200
        with pytest.raises(NoAnswer):
            await client.request("POST", server.url, {}, b"2", keep=99)
        assert len(server.requests) == 2  # sent once, never twice
        await client.close()


@on_both_loops
async def test_no_second_send_once_an_answer_began_or_on_a_new_connection() -> None:
    keyed = {"Idempotency-Key": "order-1"}
    # A byte of an answer came: the server had the request in hand.
    async with ClosesOnSecond(second=b"HTTP/1.1 50") as server:
        client = Client(keep=4)
        await client.request("POST", server.url, keyed, b"1", keep=99)
        with pytest.raises(NoAnswer):
            await client.request("POST", server.url, keyed, b"2", keep=99)
        assert len(server.requests) == 2
        await client.close()
    # A new connection closed without an answer: not a stale one, no retry.
    async with RawServer(b"") as raw:
        client = Client(keep=4)
        with pytest.raises(NoAnswer):
            await client.request("POST", raw.url, keyed, b"x", keep=99)
        assert raw.connections == 1
        await client.close()


def test_one_error_tree_each_kind_with_its_meaning_for_a_delivery() -> None:
    """What Client.request raises: one base, each kind retried or not."""
    assert not RequestError("x").retryable
    for transport in (
        ConnectError("crm.example", 443, "Connection refused"),
        ProxyError("proxy refused CONNECT"),
        TLSError("CERTIFICATE_VERIFY_FAILED"),
        NoAnswer(),
        BadAnswer("not HTTP"),
    ):
        assert isinstance(transport, TransportError)
        assert isinstance(transport, ClientError)
        assert transport.retryable
    dns = ConnectError("crm.example", 80, "x", dns=True)
    assert str(dns) == "DNS lookup failed for crm.example"
    assert str(NoAnswer()) == "server closed the connection without answering"


def test_the_environments_proxy_as_curl_reads_it() -> None:
    """HTTPS_PROXY for https URLs, HTTP_PROXY for http ones, lower case first;
    NO_PROXY a list of hosts and their subdomains, "*" for all (curl's
    manual, "ENVIRONMENT"; urllib, httpx and aiohttp's trust_env read it alike)."""
    env = {
        "https_proxy": "http://u:p@lower.corp:3128",
        "HTTPS_PROXY": "http://upper.corp:3128",
        "HTTP_PROXY": "plain.corp:8080",
        "NO_PROXY": "internal.example, .local",
    }
    found = environment_proxy("https://crm.example/x", env)
    assert found is not None
    assert (found.host, found.port) == ("lower.corp", 3128)
    assert found.authorization == "Basic " + base64.b64encode(b"u:p").decode()
    plain = environment_proxy("http://crm.example/x", env)
    assert plain is not None
    assert (plain.host, plain.port, plain.authorization) == ("plain.corp", 8080, None)
    for exempt in ("https://internal.example/", "https://crm.internal.example/", "http://a.local/"):
        assert environment_proxy(exempt, env) is None
    assert environment_proxy("https://crm.example/", {**env, "NO_PROXY": "*"}) is None
    assert environment_proxy("https://crm.example/", {}) is None
    # One that cannot be used is named, its value (a password?) never shown.
    with pytest.raises(ProxyError, match=r"^HTTPS_PROXY in relay's environment") as refused:
        environment_proxy("https://crm.example/", {"HTTPS_PROXY": "socks5://u:pw@s.corp"})
    assert "pw" not in str(refused.value)
