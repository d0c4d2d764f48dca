"""relay.ingress.http1 over real sockets: framing, order, limits, timeouts, lingering, shutdown.

The handler here is a whole small one (it admits by path, answers from the
body, waits on a future where asked): what ingress does, minus the store.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from relay.ingress import httplog
from relay.ingress.guard import QUIET_SECONDS, ConnectionCap
from relay.ingress.http1 import (
    MAX_HEAD,
    MAX_HEADERS,
    MAX_PIPELINED,
    Head,
    Http1Server,
    Response,
    serialize,
)

LIMIT = 1000
TIMEOUT = 0.3  # the served fixture's: idle, head and body
ONE_READ = 256 * 1024  # the most asyncio's and uvloop's transports read at once


class Exchange:
    def __init__(self, handler: Handler, head: Head) -> None:
        self.handler = handler
        self.head = head
        self.limit = LIMIT

    def answer(self, body: bytes) -> Response | asyncio.Future[Any]:
        self.handler.bodies.append(body)
        if self.head.path == "/boom":
            raise RuntimeError("a bug in the handler")
        if self.head.path == "/large":
            return Response(200, b"x" * 1_000_000)
        if self.head.path == "/slow":
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self.handler.slow.append(future)
            return future
        head = self.head
        return Response(200, b"%s %s %d" % (head.path.encode(), head.query.encode(), len(body)))

    def settle(self, done: asyncio.Future[Any]) -> Response:
        return Response(200, b"slow " + done.result())

    def refused(self, status: int) -> None:
        self.handler.refused.append(status)

    def release(self) -> None:
        self.handler.open -= 1


class Handler:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.slow: list[asyncio.Future[Any]] = []
        self.open = 0  # admitted and not yet released
        self.heads: list[Head] = []
        self.refused: list[int] = []  # by relay.ingress.http1, after admission

    def admit(self, head: Head) -> Exchange | Response:
        self.heads.append(head)
        if head.path == "/nope":
            return Response(404, b"no")
        if head.content_length is not None and head.content_length > LIMIT:
            return Response(413, b"too large")
        self.open += 1
        return Exchange(self, head)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Handler, Http1Server, int]]:
    handler = Handler()
    # Short, as its length is not the point: every test that waits on it is shorter.
    server = Http1Server(handler, timeout=TIMEOUT, max_body=lambda: LIMIT)
    listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    yield handler, server, port
    await server.drain(listener.close, asyncio.get_running_loop().time() + 0.3, quiet=0)
    await listener.wait_closed()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def answers(reader: asyncio.StreamReader, count: int) -> list[tuple[bytes, bytes]]:
    """`count` answers: (status line with headers, body)."""
    found = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        found.append((head, await asyncio.wait_for(reader.readexactly(length), 3)))
    return found


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (
        path,
        extra,
        len(body),
        body,
    )


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(
    served: tuple[Handler, Http1Server, int],
) -> None:
    handler, _, port = served
    reader, writer = await connect(port)
    # The first waits for its "commit"; the two behind it must not overtake it.
    writer.write(post(b"/slow", b"a") + post(b"/x?q=1", b"bb") + post(b"/y", b"ccc"))
    await asyncio.sleep(0.1)
    assert len(handler.slow) == 1
    assert handler.bodies == [b"a"]  # the others wait parsed, unanswered
    handler.slow[0].set_result(b"done")
    got = await answers(reader, 3)
    assert [body for _, body in got] == [b"slow done", b"/x q=1 2", b"/y  3"]
    assert all(b"Connection: close" not in head for head, _ in got)
    writer.write(post(b"/z", b""))  # and the connection is still usable
    assert (await answers(reader, 1))[0][1] == b"/z  0"
    writer.close()
    await asyncio.sleep(0.05)
    assert handler.open == 0


async def test_chunked_bodies_are_joined_and_held_to_the_limit(
    served: tuple[Handler, Http1Server, int],
) -> None:
    handler, _, port = served
    reader, writer = await connect(port)
    head = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    writer.write(head + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert (await answers(reader, 1))[0][1] == b"/c  5"
    assert handler.bodies == [b"abcde"]
    chunk = b"%x\r\n%s\r\n" % (600, b"x" * 600)
    writer.write(head + chunk + chunk)  # 1200 bytes, past the 1000 limit
    [(status, _)] = await answers(reader, 1)
    assert status.startswith(b"HTTP/1.1 413 ")
    assert b"Connection: close" in status
    assert handler.refused == [413]  # told to the exchange (ingress counts it)
    writer.close()
    await asyncio.sleep(0.05)
    assert handler.open == 0


async def test_an_early_answer_reaches_a_client_still_sending(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """Answered on its head (413 by Content-Length), the rest of the body is read
    and dropped: closing at once would reset the connection under the answer."""
    _, _, port = served
    reader, writer = await connect(port)
    writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n")
    for _ in range(30):
        writer.write(b"x" * 10_000)
        await writer.drain()
    [(status, body)] = await answers(reader, 1)
    assert status.startswith(b"HTTP/1.1 413 ")
    assert body == b"too large"
    assert await asyncio.wait_for(reader.read(), 3) == b""  # then it closes
    writer.close()


async def test_a_connection_that_ends_mid_body_releases_its_request(
    served: tuple[Handler, Http1Server, int],
) -> None:
    handler, _, port = served
    reader, writer = await connect(port)
    writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part")
    await asyncio.sleep(0.05)
    assert handler.open == 1
    writer.write_eof()
    [(status, _)] = await answers(reader, 1)
    assert status.startswith(b"HTTP/1.1 400 ")
    assert handler.open == 0
    assert handler.bodies == []  # never answered as if complete
    writer.close()


async def test_upgrade_is_ignored_and_the_body_read_by_its_length(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """curl --http2 on http:// asks for h2c; RFC 9110 lets the server answer in HTTP/1.1."""
    handler, _, port = served
    reader, writer = await connect(port)
    upgrade = (
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    )
    writer.write(post(b"/u", b'{"order": 7}', upgrade))
    [(status, body)] = await answers(reader, 1)
    assert status.startswith(b"HTTP/1.1 200 ")
    assert body == b"/u  12"
    assert handler.bodies == [b'{"order": 7}']
    assert b"Connection: close" in status
    writer.close()
    reader, writer = await connect(port)
    chunked = b"Connection: Upgrade\r\nUpgrade: h2c\r\nTransfer-Encoding: chunked\r\n"
    writer.write(b"POST /u HTTP/1.1\r\nHost: x\r\n" + chunked + b"\r\n5\r\nhello\r\n0\r\n\r\n")
    [(status, _)] = await answers(reader, 1)
    assert status.startswith(b"HTTP/1.1 400 ")  # no framing left that llhttp checked
    writer.close()


MANY_HEADERS = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1))


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"POST / HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"POST / HTTP/1.1\r\n" + MANY_HEADERS + b"\r\n", 431),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
    ],
    ids=["long line", "long header", "too many headers", "two lengths", "length and chunked",
         "h2 preface"],
)  # fmt: skip
async def test_heads_past_the_bounds_and_ambiguous_framing_are_refused(
    served: tuple[Handler, Http1Server, int], request_bytes: bytes, status: int
) -> None:
    handler, _, port = served
    reader, writer = await connect(port)
    writer.write(request_bytes)
    answer = await asyncio.wait_for(reader.read(), 3)  # answered, then closed
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:80]
    assert handler.bodies == []
    writer.close()


async def test_a_head_trickled_past_the_bound_is_cut_off(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """httptools gathers a header line before it calls back: the bytes of an
    unfinished head are counted as they arrive, so one line cannot grow unbounded
    (past MAX_HEAD, give or take the read the head began in)."""
    _, _, port = served
    reader, writer = await connect(port)
    writer.write(b"POST / HTTP/1.1\r\nX-Long: ")
    reading = asyncio.ensure_future(reader.read())
    sent = 0
    while not reading.done() and sent <= MAX_HEAD + ONE_READ:
        writer.write(b"a" * 4096)
        sent += 4096
        await asyncio.sleep(0.001)
    answer = await asyncio.wait_for(reading, 3)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert sent <= MAX_HEAD + ONE_READ
    writer.close()


async def test_a_slow_body_gets_408_and_a_silent_connection_is_closed(
    served: tuple[Handler, Http1Server, int],
) -> None:
    handler, _, port = served
    reader, writer = await connect(port)
    writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
    started = time.monotonic()
    answer = await asyncio.wait_for(reader.read(), 3)
    assert answer.startswith(b"HTTP/1.1 408 ")
    # The timeout, swept every quarter of it (0.075 s).
    assert TIMEOUT - 0.1 < time.monotonic() - started < TIMEOUT + 1.0
    assert handler.open == 0
    assert handler.refused == [408]
    writer.close()
    reader, writer = await connect(port)
    assert await asyncio.wait_for(reader.read(), 3) == b""  # idle: closed without a word
    writer.close()


async def test_a_handler_failure_is_a_500_and_the_connection_goes_on(
    served: tuple[Handler, Http1Server, int], caplog: pytest.LogCaptureFixture
) -> None:
    handler, _, port = served
    reader, writer = await connect(port)
    writer.write(post(b"/boom", b"{}") + post(b"/after", b"1"))
    got = await answers(reader, 2)
    assert got[0][0].startswith(b"HTTP/1.1 500 ")
    assert got[1][1] == b"/after  1"
    assert "a bug in the handler" in caplog.text  # with its traceback, for us
    assert handler.open == 0
    writer.close()


async def test_answered_on_the_head_expect_continue_and_http_1_0(
    served: tuple[Handler, Http1Server, int],
) -> None:
    _, _, port = served
    reader, writer = await connect(port)
    writer.write(post(b"/nope", b"{}"))  # whole body sent: the connection stays open
    [(status, body)] = await answers(reader, 1)
    assert status.startswith(b"HTTP/1.1 404 ")
    assert body == b"no"
    writer.write(post(b"/e", b"", b"Expect: 100-continue\r\n").replace(b"Length: 0", b"Length: 2"))
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"{}")
    assert (await answers(reader, 1))[0][1] == b"/e  2"
    writer.close()
    reader, writer = await connect(port)
    writer.write(b"POST /old HTTP/1.0\r\nContent-Length: 1\r\n\r\nx")
    answer = await asyncio.wait_for(reader.read(), 3)  # HTTP/1.0 without keep-alive: closed
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"Connection: close" in answer
    writer.close()


async def test_a_drain_answers_what_waits_and_closes_idle_connections_before_it_stops_accepting(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """A stop's end (Http1Server.drain): every answer closes its connection,
    idle ones are closed, and only then does the listener stop accepting (a
    sender whose kept-alive connection closes connects again, and is served
    or waits in systemd's queue); a request waiting for its commit is answered."""
    handler, server, port = served
    loop = asyncio.get_running_loop()
    waiting_reader, waiting = await connect(port)
    idle_reader, idle = await connect(port)
    idle.write(post(b"/before", b""))
    assert (await answers(idle_reader, 1))[0][1] == b"/before  0"
    waiting.write(post(b"/slow", b"a"))
    await asyncio.sleep(0.05)
    idle_when_stopped: list[int] = []

    def stop_accepting() -> None:
        idle_when_stopped.append(sum(c.idle_since is not None for c in server.connections))

    stopping = asyncio.create_task(server.drain(stop_accepting, loop.time() + 3, quiet=0.2))
    assert await asyncio.wait_for(idle_reader.read(), 1) == b""  # idle: closed
    await asyncio.sleep(0.05)
    assert idle_when_stopped == [0]
    assert not stopping.done()
    handler.slow[0].set_result(b"committed")
    answer = await asyncio.wait_for(waiting_reader.read(), 2)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"slow committed")
    assert b"Connection: close" in answer
    await asyncio.wait_for(stopping, 2)
    for writer in (waiting, idle):
        writer.close()


async def test_a_request_sent_on_an_idle_connection_as_the_drain_begins_is_answered(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """A kept-alive sender may be sending its next request as the stop begins:
    closing its connection at once would reset it under that request. It is
    answered, with Connection: close, and so are requests on connections opened
    while the listener still accepts."""
    _, server, port = served
    loop = asyncio.get_running_loop()
    reader, writer = await connect(port)
    writer.write(post(b"/one", b""))
    assert b"Connection: close" not in (await answers(reader, 1))[0][0]
    accepting = [True]
    stopping = asyncio.create_task(
        server.drain(lambda: accepting.pop(), loop.time() + 3, quiet=0.5)
    )
    await asyncio.sleep(0.1)
    writer.write(post(b"/two", b""))
    answer = await asyncio.wait_for(reader.read(), 1)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"Connection: close" in answer
    assert answer.endswith(b"/two  0")
    assert accepting  # answered, then closed: nothing idle kept the listener open
    new_reader, new = await connect(port)
    new.write(post(b"/new", b""))
    answer = await asyncio.wait_for(new_reader.read(), 1)
    assert b"Connection: close" in answer
    await asyncio.wait_for(stopping, 2)
    assert not accepting
    for client in (writer, new):
        client.close()


async def test_a_drain_ends_by_its_deadline(served: tuple[Handler, Http1Server, int]) -> None:
    """A request whose commit never comes holds the stop no longer than its budget."""
    _, server, port = served
    loop = asyncio.get_running_loop()
    reader, writer = await connect(port)
    writer.write(post(b"/slow", b"a"))
    await asyncio.sleep(0.05)
    started = loop.time()
    await server.drain(lambda: None, started + 0.3, quiet=0.1)
    assert loop.time() - started < 0.5
    assert await asyncio.wait_for(reader.read(), 1) == b""  # aborted
    assert not server.connections
    writer.close()


def test_a_header_value_cannot_start_another_header() -> None:
    wire = serialize(
        Response(200, b"ok", "text/plain\r\nSet-Cookie: x=1", (("X-A", "1\nX-B: 2"),)),
        close=False,
    )
    lines = wire.split(b"\r\n\r\n")[0].split(b"\r\n")
    assert lines[1] == b"Content-Type: text/plain  Set-Cookie: x=1"
    assert lines[2] == b"X-A: 1 X-B: 2"
    assert any(line.startswith(b"Date: ") for line in lines)


async def test_trailer_fields_are_dropped_and_bounded(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """Trailers are not headers (RFC 9110 section 6.5.1): never merged into the
    stored head. Before: each was appended to it, and a trailer section that
    never ended grew without bound (19 MB of them: +200 MB, the loop held 3 s)."""
    handler, _, port = served
    reader, writer = await connect(port)
    head = b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    writer.write(head + b"2\r\n{}\r\n0\r\nIdempotency-Key: forged\r\nX-Trailer: 1\r\n\r\n")
    assert (await answers(reader, 1))[0][1] == b"/t  2"
    assert [name for name, _ in handler.heads[0].raw_headers] == [b"Host", b"Transfer-Encoding"]
    writer.close()
    for endless in (b"X-T: v\r\n" * 4096, b"a" * 32768):  # many trailers; one long trailer
        reader, writer = await connect(port)
        writer.write(head + b"2\r\n{}\r\n0\r\n" + (b"X-Long: " if endless[0] == 97 else b""))
        reading = asyncio.ensure_future(reader.read())
        sent = 0
        while not reading.done() and sent < 8 * MAX_HEAD:
            writer.write(endless)
            sent += len(endless)
            await asyncio.sleep(0.005)
        answer = await asyncio.wait_for(reading, 3)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
        assert sent < 8 * MAX_HEAD
        writer.close()
    await asyncio.sleep(0.05)
    assert handler.open == 0


class Metered(asyncio.Protocol):
    """A connection of `server` that counts the bytes it was given."""

    received = 0

    def __init__(self, server: Http1Server) -> None:
        self.inner = server()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        Metered.received += len(data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)


async def test_nothing_is_read_past_a_refused_request_while_earlier_ones_wait(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """Before: with a request waiting for its commit, the one after it, refused
    (414), was still parsed: 17.7 MB of its request line held within a second."""
    handler, server, _ = served
    listener = await asyncio.get_running_loop().create_server(
        lambda: Metered(server), "127.0.0.1", 0
    )
    reader, writer = await connect(listener.sockets[0].getsockname()[1])
    writer.write(post(b"/slow", b"a") + b"POST /")
    await asyncio.sleep(0.05)
    Metered.received = 0
    for _ in range(100):  # 6.4 MB of request line
        writer.write(b"a" * 65536)
        await asyncio.sleep(0.001)
    assert Metered.received < 1024 * 1024
    handler.slow[0].set_result(b"done")
    [(_, body)] = await answers(reader, 1)
    assert body == b"slow done"
    answer = await asyncio.wait_for(reader.read(), 3)
    assert answer.startswith(b"HTTP/1.1 414 "), answer[:80]
    writer.close()
    listener.close()


async def test_a_flood_of_pipelined_requests_is_cut_off(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """Before: 6,400 tiny requests in one read were all parsed and answered in
    one go (the loop held ~100 ms; more when each logs a refusal)."""
    handler, _, port = served
    reader, writer = await connect(port)
    writer.write(b"POST /f HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" * (MAX_PIPELINED * 10))
    got = await answers(reader, MAX_PIPELINED + 1)
    assert [head[:12] for head, _ in got] == [b"HTTP/1.1 200"] * MAX_PIPELINED + [b"HTTP/1.1 429"]
    assert await asyncio.wait_for(reader.read(), 3) == b""
    assert len(handler.heads) == MAX_PIPELINED
    writer.close()


async def test_a_pipelined_head_split_across_reads_is_not_counted_with_the_requests_before_it(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """Before: every byte of the read was counted against the head being parsed,
    so a head cut by a read after 64 KiB of earlier requests got 431."""
    _, _, port = served
    reader, writer = await connect(port)
    first = post(b"/p", b"x" * 900) * 80  # 73 KiB, within MAX_PIPELINED requests
    last = post(b"/last", b"{}")
    writer.write(first + last[:10])
    await asyncio.sleep(0.1)
    writer.write(last[10:])
    got = await answers(reader, 81)
    assert [head[:12] for head, _ in got] == [b"HTTP/1.1 200"] * 81
    assert got[-1][1] == b"/last  2"
    writer.close()


async def test_requests_answered_on_their_head_keep_the_connection_alive(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """Before: the idle deadline was not renewed by an answer on the head (404,
    413, 503...): the connection was closed a timeout after it opened, mid-use."""
    _, _, port = served
    reader, writer = await connect(port)
    for _ in range(5):  # 2.5 timeouts in all, half of one apart
        writer.write(post(b"/nope", b"{}"))
        [(status, _)] = await answers(reader, 1)
        assert status.startswith(b"HTTP/1.1 404 ")
        await asyncio.sleep(TIMEOUT / 2)
    writer.write(post(b"/still", b"{}"))
    assert (await answers(reader, 1))[0][1] == b"/still  2"
    writer.close()


HOST = b"POST / HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (HOST + b"Transfer-Encoding: gzip, chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", 501),
        (HOST + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"1\r\na\r\n0\r\n\r\n", 501),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", 400),
    ],
    ids=["gzip then chunked", "in two lines", "HTTP/1.0"],
)  # fmt: skip
async def test_transfer_codings_other_than_chunked_are_refused(
    served: tuple[Handler, Http1Server, int], request_bytes: bytes, status: int
) -> None:
    """Before: llhttp de-chunks "gzip, chunked" and leaves the gzip: the body
    was taken (stored by ingress, 200) still transfer-coded."""
    handler, _, port = served
    reader, writer = await connect(port)
    writer.write(request_bytes)
    answer = await asyncio.wait_for(reader.read(), 3)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:80]
    assert handler.bodies == []
    writer.close()


async def test_an_answer_to_head_has_no_body(served: tuple[Handler, Http1Server, int]) -> None:
    """Before: HEAD got the body too, and the client read it as the next answer."""
    _, _, port = served
    reader, writer = await connect(port)
    writer.write(b"HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n" + post(b"/next", b"{}"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    assert head.startswith(b"HTTP/1.1 404 ")
    assert b"Content-Length: 2\r\n" in head  # what a GET would have been sent
    [(status, body)] = await answers(reader, 1)
    assert status.startswith(b"HTTP/1.1 200 ")
    assert body == b"/next  2"
    writer.close()


async def pin(port: int) -> socket.socket:
    """A client that asks for more answers than the socket buffers hold and
    never reads one."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
    client.send(post(b"/large", b"") * 8)  # 8 MB of answers
    return client


async def test_a_client_that_never_reads_its_answers_is_dropped(
    served: tuple[Handler, Http1Server, int],
) -> None:
    """Before: a connection closed with answers still unsent waited for the
    client to take them, forever: its descriptor and buffers were held past
    every timeout (and relay.ingress.guard's eviction of it freed nothing)."""
    _, server, port = served
    client = await pin(port)
    try:
        await asyncio.sleep(0.1)
        assert server.connections  # its answers being sent
        for _ in range(40):  # the idle timeout, then as long for the answers to go
            if not server.connections:
                break
            await asyncio.sleep(0.1)
        assert not server.connections
    finally:
        client.close()


async def test_room_made_by_the_cap_is_made_even_when_the_client_reads_nothing() -> None:
    """Before: relay.ingress.guard made room with transport.close(), which waits for the
    unsent answers of a client that reads none: the cap counted it gone and its
    descriptor stayed (under ulimit -n 256 they took every descriptor, and
    webhooks and /readyz were refused)."""
    handler = Handler()
    server = Http1Server(handler, timeout=30, max_body=lambda: LIMIT)  # no timeout helps
    cap = ConnectionCap(server, 2, "test")
    listener = await asyncio.get_running_loop().create_server(cap, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    pinned = [await pin(port), await pin(port)]
    try:
        await asyncio.sleep(QUIET_SECONDS + 0.1)
        reader, writer = await connect(port)
        writer.write(post(b"/new", b"{}"))
        assert (await answers(reader, 1))[0][1] == b"/new  2"
        assert cap.evicted == 1
        assert len(server.connections) == 2  # the one evicted is gone
        writer.close()
    finally:
        for client in pinned:
            client.close()
        await server.drain(listener.close, asyncio.get_running_loop().time() + 1, quiet=0)


async def test_every_refusal_on_the_head_is_logged_in_one_line(
    served: tuple[Handler, Http1Server, int],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: only a 400 was logged; a 414, 431 or 501 refused its request silently
    (aiohttp logged them, through relay.ingress.httplog's filter, as one line each)."""
    monkeypatch.setattr(httplog, "_refusals", httplog.RefusedRequests())  # a window of its own
    _, _, port = served
    for request_bytes in (
        b"POST /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    ):
        reader, writer = await connect(port)
        writer.write(request_bytes)
        await asyncio.wait_for(reader.read(), 3)
        writer.close()
    lines = [record.getMessage() for record in caplog.records if record.name == "relay.http"]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "request line longer than 8190 bytes",
        "a header longer than 8190 bytes",
        "no transfer coding but chunked is accepted",
    ]
    assert all(line.startswith("refused a malformed request from 127.0.0.1: ") for line in lines)


async def test_an_http_1_0_client_asking_for_keep_alive_is_told_it_is_kept(
    served: tuple[Handler, Http1Server, int],
) -> None:
    # An HTTP/1.0 connection closes after each answer unless the answer says
    # `Connection: keep-alive`: without it the client waited for a close that
    # never came, or opened a new connection for every request.
    _, _, port = served
    reader, writer = await connect(port)
    ask = b"POST /old HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx"
    writer.write(ask)
    [(status, body)] = await answers(reader, 1)
    assert b"Connection: keep-alive" in status
    assert body == b"/old  1"
    writer.write(ask)  # and it is kept
    assert (await answers(reader, 1))[0][1] == b"/old  1"
    writer.close()


def test_header_values_read_as_utf8_and_are_stored_as_latin1() -> None:
    # Decoded once (latin-1) for both: the view re-reads a value as UTF-8 only
    # when it is not ASCII, and a byte that is not UTF-8 stays a lone surrogate.
    values = [b"plain", "заказ-1".encode(), "заказ-1".encode("cp1251")]
    head = Head(
        method="POST",
        path="/",
        query="",
        raw_headers=[(b"X-Value", value) for value in values],
        remote=None,
        keep_alive=True,
        content_length=0,
    )
    assert head.headers.getall("x-value") == [
        value.decode("utf-8", "surrogateescape") for value in values
    ]
    assert head.fields == [("X-Value", value.decode("latin-1")) for value in values]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /h HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", b"400"),
        (b"POST /h HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 1\r\n\r\nx", b"400"),
        (b"POST /h HTTP/1.0\r\nContent-Length: 1\r\n\r\nx", b"200"),  # 1.0 had no Host
        (b"POST /h HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx", b"200"),
    ],
    ids=["none", "two", "http/1.0", "one"],
)
async def test_an_http_1_1_request_needs_exactly_one_host(
    served: tuple[Handler, Http1Server, int], request_bytes: bytes, status: bytes
) -> None:
    # RFC 9112 section 3.2: "A server MUST respond with a 400 (Bad Request)
    # status code to any HTTP/1.1 request message that lacks a Host header
    # field and to any request message that contains more than one Host header
    # field line". Before, such a request was stored.
    _, _, port = served
    reader, writer = await connect(port)
    writer.write(request_bytes)
    answer = await asyncio.wait_for(reader.read(), 3)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 " + status), answer
