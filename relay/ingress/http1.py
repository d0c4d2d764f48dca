"""HTTP/1.1 for the ingress listener: llhttp (through httptools) frames, relay answers.

A webhook needs its method, path, query, headers and body, and one answer
once its commit is done. aiohttp's server builds per request a request
object, a stream reader, a task, a response object and a writer, several
times what llhttp driven by a bare protocol costs (bench/bare_lowlevel.py
under bench/ingest.py's load; the figures: bench/RESULTS.md).
This module does only the framing, with the bounds
relay relied on aiohttp for, each pinned by a test (tests/unit/test_http1.py,
tests/chaos/test_hostile_http.py):

- a head of at most MAX_HEADERS headers, MAX_LINE bytes in its request line
  or any one header, MAX_HEAD bytes in all (counted from the read it began
  in, whatever came before it there), else 431 (414 for the line);
- a connection that is silent, or sends half a head, for `timeout` seconds
  is closed (408 when a request had begun); a body still incomplete
  `timeout` seconds after its head gets 408; a connection closed with
  answers its client has not taken in `timeout` seconds is aborted;
- the handler sees a request's head before its body: it may answer at once
  (404, 413 on Content-Length, 503...; to HEAD without the body) and the
  body is never read, or admit it with a size limit that then holds for the
  body as it arrives (413);
  `Expect: 100-continue` is answered only after the head was admitted;
- pipelined requests are answered in order; while one waits for its commit
  the next ones wait parsed, and reading pauses once one waits; more than
  MAX_PIPELINED of them unanswered get 429 and the connection closes;
- a transfer coding other than chunked gets 501 (400 in HTTP/1.0);
- trailer fields are read and dropped, never merged into the head; reads
  of a chunked body that bring none of it (framing, trailers) count
  against MAX_HEAD, else 431;
- a malformed request gets 400 and the connection closes, logged as one
  rate-limited line (relay.ingress.httplog);
- an `Upgrade` is ignored, as RFC 9110 section 7.8 allows: the body is read
  by its Content-Length, answered, and the connection closed.

The admin listener stays on aiohttp: its requests are few and its pages
want a router, sessions and templates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol, cast
from urllib.parse import unquote

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from relay.ingress.httplog import refused

log = logging.getLogger("relay.http")

MAX_HEADERS = 100
MAX_LINE = 8190  # the request line, or one header's name and value (aiohttp's default)
MAX_HEAD = 64 * 1024  # the whole head, however it is cut into lines
# Pipelined requests parsed ahead of the one being answered, before reading pauses.
MAX_AHEAD = 1
# Requests one read may bring before their answers: past this, 429 and the
# connection closes (reading pauses only after a read is parsed).
MAX_PIPELINED = 100
# At a stop, a connection idle this long is closed. One just answered may be
# sending its next request already, which a close would lose (its sender sees
# the connection reset): it gets this long to send it, and is answered with
# Connection: close instead. A sender sends its next webhook as soon as it has
# one; one idle for longer is as likely to send at any moment as at this one.
CLOSE_IDLE_AFTER = 0.5


# Head and Response are made for every request: plain classes, whose __init__
# mypyc compiles (not one that a dataclass generates).


class Head:
    """A request's head, as the handler reads it before any of its body."""

    def __init__(
        self,
        method: str,
        path: str,  # percent-decoded, as routes are matched
        query: str,  # as sent (undecoded), after the "?"
        raw_headers: list[tuple[bytes, bytes]],
        remote: str | None,
        keep_alive: bool,
        content_length: int | None,  # None: chunked, or no body
        asked_keep_alive: bool = False,  # `Connection: keep-alive` (an HTTP/1.0 client's way)
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.raw_headers = raw_headers
        self.remote = remote
        self.keep_alive = keep_alive
        self.content_length = content_length
        self.asked_keep_alive = asked_keep_alive
        self._fields: list[tuple[str, str]] | None = None
        self._headers: CIMultiDictProxy[str] | None = None

    @property
    def fields(self) -> list[tuple[str, str]]:
        """Each header's name and value as stored, in order: latin-1, so every
        byte is kept as one character."""
        if self._fields is None:
            self._fields = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self.raw_headers]
        return self._fields

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """By name, case-insensitive; values decoded as aiohttp did (UTF-8, each
        byte that is not UTF-8 kept as a lone surrogate, so keys stay distinct)."""
        if self._headers is None:
            self._headers = CIMultiDictProxy(
                CIMultiDict(
                    [
                        # An ASCII value reads the same either way: decoded once.
                        (name, value if value.isascii() else _utf8(value))
                        for name, value in self.fields
                    ]
                )
            )
        return self._headers

    @property
    def expects_continue(self) -> bool:
        return any(
            name.lower() == b"expect" and value.strip().lower() == b"100-continue"
            for name, value in self.raw_headers
        )


def _utf8(latin1: str) -> str:
    return latin1.encode("latin-1").decode("utf-8", "surrogateescape")


class Response:
    """An answer to send; never changed once made (some are shared constants)."""

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = "application/json",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class Exchange(Protocol):
    """One admitted request, made by the handler from its head."""

    @property
    def limit(self) -> int:
        """The largest body it takes; past it the sender gets 413."""
        ...

    def answer(self, body: bytes) -> Response | asyncio.Future[Any]:
        """The answer now, or a future after which `settle` gives it."""
        ...

    def settle(self, done: asyncio.Future[Any]) -> Response:
        """The answer once the future `answer` returned is done."""
        ...

    def refused(self, status: int) -> None:
        """Answered by relay.ingress.http1 while its body came: 413 (past `limit`) or 408
        (not all in within the timeout); `release` follows."""
        ...

    def release(self) -> None:
        """The exchange is over (answered, or its connection gone): called once."""
        ...


class Handler(Protocol):
    def admit(self, head: Head) -> Exchange | Response:
        """Admit a request on its head (an Exchange), or answer it at once."""
        ...


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_STATUS_LINES = {
    status: b"HTTP/1.1 %d %s\r\n" % (status, _reason(status).encode()) for status in range(100, 600)
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _Date:
    """The Date header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = 0
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode()
        return self._value


_date = _Date()


def _header_value(value: str) -> bytes:
    # A value must not end the header early: a CR or LF would start another.
    if "\r" in value or "\n" in value:
        value = value.replace("\r", " ").replace("\n", " ")
    return value.encode("latin-1", "replace")


_JSON_ANSWER = b"%sContent-Type: application/json\r\nContent-Length: %d\r\nDate: %s\r\n\r\n%s"


def serialize(response: Response, *, close: bool, say_kept: bool = False) -> bytes:
    """The answer on the wire; `say_kept` for a client that asked for keep-alive
    in a header (HTTP/1.0 closes after each answer unless it is told so)."""
    if (
        not close
        and not say_kept
        and not response.headers
        and response.content_type == "application/json"
    ):
        # Nearly every answer: one formatting instead of a list to join.
        status = _STATUS_LINES.get(response.status) or _STATUS_LINES[500]
        return _JSON_ANSWER % (status, len(response.body), _date.now(), response.body)
    parts = [_STATUS_LINES.get(response.status) or _STATUS_LINES[500]]
    if response.content_type is not None:
        parts.append(b"Content-Type: %s\r\n" % _header_value(response.content_type))
    for name, value in response.headers:
        parts.append(b"%s: %s\r\n" % (name.encode("latin-1"), _header_value(value)))
    if response.status != 204:  # RFC 9110 section 8.6: never in a 204
        parts.append(b"Content-Length: %d\r\n" % len(response.body))
    if close:
        parts.append(b"Connection: close\r\n")
    elif say_kept:
        parts.append(b"Connection: keep-alive\r\n")
    parts.append(b"Date: %s\r\n\r\n" % _date.now())
    parts.append(response.body)
    return b"".join(parts)


def _error(status: int, message: str) -> Response:
    body = b'{"error":"%s"}' % message.replace("\\", "\\\\").replace('"', '\\"').encode()
    return Response(status, body)


# RFC 3986 section 3.2.2's host (reg-name, IPv4, a bracketed IP literal) and a
# port: unreserved, pct-encoded and sub-delims characters, ":" and brackets.
_HOST_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~%!$&'()*+,;=:[]"


def valid_host(value: bytes) -> bool:
    """Whether a Host header's value is uri-host [ ":" port ] (RFC 9110 section
    7.2): only a host's characters, and digits after its last colon (outside
    an IP literal's brackets). Empty is valid: a target without an authority."""
    if value.translate(None, _HOST_BYTES):
        return False
    if value.endswith(b"]"):
        return True
    _, colon, port = value.rpartition(b":")
    return not colon or not port or port.isdigit()


def split_target(target: bytes) -> tuple[str, str]:
    """(path, query) of a request-target: the path percent-decoded (a byte
    sequence that is not UTF-8 stays encoded), the query as sent."""
    # find(), not `in`: bytes.__contains__ first tries its argument as an
    # integer, and raises and clears a TypeError for every bytes one.
    if target.find(b"%") < 0 and target.startswith(b"/"):  # nearly always: /hooks/x?a=b
        path_bytes, _, query_bytes = target.partition(b"?")
        if query_bytes.find(b"#") >= 0:
            query_bytes = query_bytes.partition(b"#")[0]
        return (
            path_bytes.decode("utf-8", "surrogateescape"),
            query_bytes.decode("utf-8", "surrogateescape"),
        )
    if not target.startswith(b"/"):
        # absolute-form (through a proxy): http://host/path?query. Its parts
        # are read as Any: httptools' stubs say bytes, a part the URL lacks is
        # None, and compiled (mypyc) code checks the stub's type on access,
        # a TypeError that made every absolute-form request without a query
        # a 400 in the compiled build (tests/unit/test_http1_parsers.py).
        url: Any = httptools.parse_url(target)
        path_bytes = url.path or b"/"
        query_bytes = url.query or b""
    else:
        path_bytes, _, query_bytes = target.partition(b"?")
        query_bytes = query_bytes.partition(b"#")[0]
    path = path_bytes.decode("utf-8", "surrogateescape")
    if "%" in path:
        with contextlib.suppress(UnicodeDecodeError):  # not UTF-8: matched as sent
            path = unquote(path, errors="strict")
    return path, query_bytes.decode("utf-8", "surrogateescape")


class _Message:
    """One request: parsed head, its body as it comes, and its exchange once admitted."""

    __slots__ = ("chunks", "complete", "continued", "exchange", "head", "overflow", "size")

    def __init__(self, head: Head) -> None:
        self.head = head
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflow = False  # more body than the limit: the rest was not kept
        self.complete = False
        self.continued = False  # 100 Continue sent
        self.exchange: Exchange | None = None

    def body(self) -> bytes:
        chunks = self.chunks
        if not chunks:
            return b""
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# What a connection's deadline means when it passes.
_IDLE = 0  # waiting for a request (or the rest of its head)
_BODY = 1  # an admitted request's body is still coming
_LINGER = 2  # answered before its body ended: the rest is read and dropped


class Connection(asyncio.Protocol):
    """One client connection of the ingress listener."""

    def __init__(self, server: Http1Server) -> None:
        self._server = server
        self._handler = server.handler
        self._loop = server.loop
        self._transport: asyncio.Transport | None = None
        self._remote: str | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[_Message] = deque()  # parsed heads, answered in order
        self._parsing: _Message | None = None  # head complete, body being parsed
        self._waiting: _Message | None = None  # the first message, waiting for its answer
        # Answered before its body was all in: the rest is read and dropped
        # (closing at once would reset the connection, and the client could
        # lose the answer while still sending), then the connection closes.
        self._lingering: _Message | None = None
        # Refused as malformed or too large: the answer went out with a FIN;
        # what still arrives is dropped until the client closes (or the deadline).
        self._draining = False
        self._url = b""
        self._raw: list[tuple[bytes, bytes]] = []
        self._in_head = False
        self._head_size = 0
        # A chunked body's reads that brought none of its bytes (framing, trailers).
        self._framed: _Message | None = None
        self._framed_size = 0
        self._framing = 0
        # What is wrong with the request being parsed: answered (and the
        # connection closed) once the requests before it are answered.
        self._problem: tuple[int, str] | None = None
        self._upgrade_left = -1  # bytes of an upgraded request's body still to read
        self._eof = False
        self._closing = False
        self._reading_paused = False
        self._writing_paused = False
        self.deadline: float | None = None
        self._deadline_kind = _IDLE
        self._since = 0.0  # when the deadline's kind began

    @property
    def in_request(self) -> bool:
        """A request is being handled (relay.ingress.guard never closes such a
        connection for room)."""
        return bool(self._queue)

    @property
    def receiving_head(self) -> bool:
        """Part of a request's head has come, not all of it (relay.ingress.guard sheds
        the oldest such connection first when full)."""
        return self._in_head

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self._remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
        self._server.connections.add(self)
        self._expect(_IDLE)
        self._server.watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._server.forget(self)
        self.deadline = None
        if self._queue and self._waiting is None:
            # Only the first message can be admitted; one waiting for its
            # commit is released when the commit is done (_settled).
            exchange = self._queue[0].exchange
            if exchange is not None:
                exchange.release()
        self._queue.clear()
        # The parser and this protocol refer to each other (a cycle only the
        # collector frees, and relay runs it seldom): what the connection
        # held of its requests' bodies goes now.
        self._parsing = self._lingering = self._framed = self._waiting = None
        self._raw = []
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._closing or self._draining:
            return
        if self._upgrade_left >= 0:
            self._take_upgraded_body(data)
        else:
            self._feed(data)
        self._advance()

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._upgraded(data[upgrade.args[0] :])
        except httptools.HttpParserError as error:
            self._fail(400, " ".join(str(error).split()) or type(error).__name__)
            self._drop_parsing()
        if self._in_head and self._problem is None:
            # httptools gathers a header line before it calls on_header: count
            # what arrives while a head is incomplete, so no line grows unbounded.
            if self._head_size < 0:
                # It began in this read, maybe after other requests: what of it
                # was parsed (the line being gathered is at most this read).
                self._head_size = len(self._url) + sum(len(n) + len(v) for n, v in self._raw)
            else:
                self._head_size += len(data)
            if self._head_size > MAX_HEAD:
                self._fail(431, f"request head larger than {MAX_HEAD} bytes")
        elif self._parsing is not None:
            self._body_read(len(data))

    def _body_read(self, size: int) -> None:
        """A read ended with a body unfinished. Reads of a chunked body that bring
        none of its bytes are chunk framing or trailers, which httptools gathers
        field by field until each is complete: past MAX_HEAD of them, 431."""
        message = self._parsing
        if message is None or message.head.content_length is not None:
            return  # a body of a given length: llhttp counts it down, nothing gathers
        if message is not self._framed or message.size != self._framed_size:
            self._framed, self._framed_size, self._framing = message, message.size, 0
            return
        self._framing += size
        if self._framing <= MAX_HEAD:
            return
        if message.overflow:  # answered already: nothing left worth reading
            self._close()
        elif self._problem is None:
            self._fail(431, f"chunk framing or trailers larger than {MAX_HEAD} bytes")
            self._drop_parsing()

    def eof_received(self) -> bool:
        # The client sends nothing more: answers still due go out, then it closes.
        self._eof = True
        if self._lingering is not None or self._draining:
            self._close()
            return True
        if self._drop_parsing():
            # Its body will never be complete: nothing to store, 400 to say so.
            self._problem = (400, "the connection ended before the body did")
        self._advance()
        return True

    def _drop_parsing(self) -> bool:
        """Forget the message whose body was being parsed (it cannot end well)."""
        message, self._parsing = self._parsing, None
        if message is None or not self._queue or self._queue[-1] is not message:
            return False
        self._queue.pop()
        if message.exchange is not None:  # admitted, and not waiting: its body is not in
            message.exchange.release()
        return True

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._advance()

    # httptools callbacks: they only record; answers are decided after feed_data.

    def on_message_begin(self) -> None:
        self._in_head = True
        self._url = b""
        self._raw = []
        self._head_size = -1  # begun in this read (_feed)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE and self._problem is None:
            self._fail(414, f"request line longer than {MAX_LINE} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        # Their sizes and count are checked once the head is complete (what
        # one head may hold meanwhile is bounded by MAX_HEAD, in _feed). A
        # field after the head is a trailer, which is not a header (RFC 9110
        # section 6.5.1): read and dropped, the head being what is checked and
        # stored.
        if self._in_head:
            self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        raw = self._raw  # the head's own: on_message_begin gives the next one a new list
        if self._problem is not None or self._lingering is not None:
            return
        if len(self._queue) >= MAX_PIPELINED:
            self._fail(429, f"more than {MAX_PIPELINED} requests sent ahead of their answers")
            return
        parser = self._parser
        if len(raw) > MAX_HEADERS:
            self._fail(431, f"more than {MAX_HEADERS} headers")
            return
        version = parser.get_http_version()
        if not version.startswith(("1.", "0.")):
            # RFC 9110 section 15.6.6: 505 for a major version the server does
            # not support; "HTTP/2.0" in a request line is no HTTP/2 (which has
            # none). HTTP/0.9's line has no version: invalid, 400 below.
            self._fail(505, f"HTTP/{version} is not HTTP/1.x")
            return
        length = None
        asked_keep_alive = False
        hosts = 0
        host = b""
        for name, value in raw:
            if len(name) + len(value) > MAX_LINE:
                self._fail(431, f"a header longer than {MAX_LINE} bytes")
                return
            if len(name) == 14 and name.lower() == b"content-length":
                length = int(value)  # llhttp checked it is one decimal number
            elif len(name) == 10 and name.lower() == b"connection":
                asked_keep_alive = asked_keep_alive or b"keep-alive" in value.lower()
            elif len(name) == 4 and name.lower() == b"host":
                hosts += 1
                host = value
        # RFC 9112 section 3.2: a server MUST answer 400 to an HTTP/1.1 request
        # without Host, to any with more than one, and to one whose Host is
        # not a valid value.
        if hosts > 1 or (hosts == 0 and version != "1.0"):
            self._fail(400, "a request needs exactly one Host header (RFC 9112 section 3.2)")
            return
        if not valid_host(host):
            self._fail(400, "the Host header is not a host[:port] (RFC 9112 section 3.2)")
            return
        if length is None and not self._plain_framing(raw):
            return
        try:
            path, query = split_target(self._url)
        except httptools.HttpParserError:
            self._fail(400, "invalid request target")
            return
        head = Head(
            method=parser.get_method().decode("ascii", "replace"),
            path=path,
            query=query,
            raw_headers=raw,
            remote=self._remote,
            keep_alive=parser.should_keep_alive(),
            content_length=length,
            asked_keep_alive=asked_keep_alive,
        )
        message = _Message(head)
        self._queue.append(message)
        self._parsing = message

    def _fail(self, status: int, reason: str) -> None:
        """Refuse the request being parsed: it is answered once the ones before it
        are, and nothing after it is read meanwhile (it would only be dropped, and
        httptools would gather a request line or header it is in without bound)."""
        if self._problem is None:
            self._problem = (status, reason)
            self._pause_reading()

    def _plain_framing(self, raw: list[tuple[bytes, bytes]]) -> bool:
        """For a request without Content-Length: its Transfer-Encoding, if any, is
        chunked alone. llhttp takes "gzip, chunked" as chunked and leaves the gzip
        in the body, which relay would store as if it were the payload."""
        for name, value in raw:
            if len(name) != 17 or name.lower() != b"transfer-encoding":
                continue
            if self._parser.get_http_version() == "1.0":  # RFC 9112 section 6.1: faulty
                self._fail(400, "Transfer-Encoding in an HTTP/1.0 request")
                return False
            if value.strip().lower() != b"chunked":
                self._fail(501, "no transfer coding but chunked is accepted")
                return False
        return True

    def on_body(self, chunk: bytes) -> None:
        message = self._parsing
        if message is not None:
            self._keep(message, chunk)

    def on_message_complete(self) -> None:
        if self._parsing is not None:
            self._parsing.complete = True
            self._parsing = None

    def _keep(self, message: _Message, chunk: bytes) -> None:
        if message.overflow:
            message.size += len(chunk)  # not kept, but counted (_body_read)
            return
        exchange = message.exchange
        limit = exchange.limit if exchange is not None else self._server.max_body
        if message.size + len(chunk) > limit:
            message.overflow = True  # answered 413; the rest is not kept
            message.chunks = []
            message.size += len(chunk)
            return
        message.chunks.append(chunk)
        message.size += len(chunk)

    # Answering

    def _advance(self) -> None:
        """Answer what can be answered now, in order."""
        if self._lingering is not None:
            if self._lingering.complete:
                self._close()
            return
        queue = self._queue
        while queue and self._waiting is None and not self._closing:
            message = queue[0]
            exchange = message.exchange
            if exchange is None:
                exchange = self._admit(message)
                if exchange is None:
                    continue  # answered on its head
            if message.overflow:
                exchange.refused(413)
                self._finish(message, _error(413, f"body larger than {exchange.limit} bytes"))
                return
            if not message.complete:
                if not message.continued and message.head.expects_continue:
                    message.continued = True
                    self._write(_CONTINUE)
                if self._deadline_kind != _BODY or self.deadline is None:
                    self._expect(_BODY)
                break
            self.deadline = None
            try:
                result = exchange.answer(message.body())
            except Exception:
                log.exception("ingress failed on a request from %s", self._remote)
                result = _error(500, "internal error")
            if isinstance(result, Response):
                self._finish(message, result)
                continue
            self._waiting = message
            result.add_done_callback(self._settled)
        if not queue and not self._closing:
            if self._problem is not None:
                status, reason = self._problem
                refused(self._remote, reason)  # one line, rate-limited (relay.ingress.httplog)
                self._refuse(_error(status, reason))
                return
            if self._eof:
                self._close()
                return
            if self._deadline_kind != _IDLE or self.deadline is None:
                self._expect(_IDLE)
        self._flow()

    def _admit(self, message: _Message) -> Exchange | None:
        """Ask the handler about the first message's head; None when it answered."""
        try:
            admitted = self._handler.admit(message.head)
        except Exception:
            log.exception("ingress failed on a request from %s", self._remote)
            admitted = _error(500, "internal error")
        if isinstance(admitted, Response):
            self._queue.popleft()
            self.deadline = None  # answered: the idle (or next body's) deadline starts now
            # (ingress admits only POST: an answer to HEAD is one on its head)
            self._respond(admitted, message, bodiless=message.head.method == "HEAD")
            return None
        message.exchange = admitted
        if message.size > admitted.limit:
            message.overflow = True
        return admitted

    def _settled(self, done: asyncio.Future[Any]) -> None:
        message, self._waiting = self._waiting, None
        if message is None:
            return
        exchange = message.exchange
        assert exchange is not None
        try:
            response = exchange.settle(done)
        except Exception:
            log.exception("ingress failed on a request from %s", self._remote)
            response = _error(500, "internal error")
        if self._closing:  # the connection went meanwhile: nobody to tell
            exchange.release()
            return
        self._finish(message, response)
        self._advance()

    def _finish(self, message: _Message, response: Response) -> None:
        self._queue.popleft()
        exchange = message.exchange
        if exchange is not None:
            exchange.release()
        self._respond(response, message)

    def _respond(self, response: Response, message: _Message, *, bodiless: bool = False) -> None:
        complete = message.complete
        close = not (complete and message.head.keep_alive and not message.overflow)
        if self._server.closing and not self._queue:
            close = True  # shutting down: this was the last answer on it
        wire = serialize(response, close=close, say_kept=message.head.asked_keep_alive)
        if bodiless and response.body:  # HEAD: its Content-Length, not its body
            wire = wire[: -len(response.body)]
        self._write(wire)
        if complete:
            if close:
                self._close()
            return
        message.overflow = True
        message.chunks = []
        self._queue.clear()  # nothing after it is read: the connection closes
        self._lingering = message
        self._expect(_LINGER)

    def _refuse(self, response: Response) -> None:
        """Answer, then close gently: a FIN after the answer, and what the client
        still sends is read and dropped until it closes (RFC 9112 section 9.6).
        Closing with its bytes unread would reset the connection under the answer."""
        transport = self._transport
        self._write(serialize(response, close=True))
        if transport is None or self._closing or not transport.can_write_eof():
            self._close()
            return
        transport.write_eof()
        self._draining = True
        self._queue.clear()
        self._expect(_LINGER)
        if self._reading_paused:  # paused by _fail or _flow: now it is read to be dropped
            self._reading_paused = False
            transport.resume_reading()

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._closing:
            self._transport.write(data)

    def _close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.deadline = None
        transport = self._transport
        if transport is not None:
            transport.close()  # after what was written has gone out
            if transport.get_write_buffer_size():
                # ...which waits for a client that may never read it: the
                # descriptor would be held past every timeout (expire aborts).
                self.deadline = self._loop.time() + self._server.timeout

    def abort(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    @property
    def idle_since(self) -> float | None:
        """Since when it has waited for a request, none begun; None while one is
        under way, or once it is closing."""
        if (
            self._deadline_kind != _IDLE
            or self._queue
            or self._in_head
            or self._closing
            or self._draining
            or self._lingering is not None
            or self._problem is not None
        ):
            return None
        return self._since

    def close_idle(self) -> None:
        """For a stop: close it while it waits for a request (`idle_since`)."""
        self._close()

    def _expect(self, kind: int) -> None:
        now = self._loop.time()
        self._deadline_kind = kind
        self._since = now
        self.deadline = now + self._server.timeout

    def expire(self) -> None:
        """The deadline passed (the server's sweep calls this)."""
        self.deadline = None
        if self._closing:
            if self._transport is not None:  # closed, and its answers still not taken
                self._transport.abort()
            return
        timeout = f"{self._server.timeout:g}s"
        if self._deadline_kind == _LINGER:
            self._close()
        elif self._deadline_kind == _BODY and self._queue:
            message = self._queue.popleft()
            if message.exchange is not None:
                message.exchange.refused(408)
                message.exchange.release()
            self._refuse(_error(408, f"body not received within {timeout}"))
        elif self._in_head:
            self._refuse(_error(408, f"head not received within {timeout}"))
        else:
            self._close()  # an idle keep-alive connection: nothing to say

    def _flow(self) -> None:
        """Stop reading while requests wait their turn, or while the client reads no answers."""
        if self._closing:
            return
        if self._writing_paused or len(self._queue) > MAX_AHEAD:
            self._pause_reading()
        elif self._reading_paused and self._problem is None:
            self._reading_paused = False
            if self._transport is not None:
                self._transport.resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None and not self._closing:
            self._reading_paused = True
            self._transport.pause_reading()

    # Upgrade: ignored; the body is read by its Content-Length, then the connection closes.

    def _upgraded(self, rest: bytes) -> None:
        message = self._queue[-1] if self._queue else None
        if message is None or self._problem is not None:
            self._fail(400, "upgrade without a request")
            return
        head = message.head
        head.keep_alive = False
        if any(name.lower() == b"transfer-encoding" for name, _ in head.raw_headers):
            # llhttp framed nothing past the head: a chunked body cannot be read safely.
            self._queue.pop()
            self._fail(400, "an Upgrade request with a chunked body")
            return
        length = head.content_length or 0
        message.complete = length == 0
        self._upgrade_left = length
        if rest:
            self._take_upgraded_body(rest)

    def _take_upgraded_body(self, data: bytes) -> None:
        message = self._queue[-1] if self._queue else None
        if message is None or self._upgrade_left <= 0:
            return  # past the body: the connection closes after the answer
        piece = data[: self._upgrade_left]
        self._upgrade_left -= len(piece)
        self._keep(message, piece)
        if self._upgrade_left == 0:
            message.complete = True


class Http1Server:
    """The protocol factory for the ingress listener, and its connections."""

    def __init__(self, handler: Handler, *, timeout: float, max_body: Callable[[], int]) -> None:
        self.handler = handler
        self.timeout = timeout
        self._max_body = max_body
        self.connections: set[Connection] = set()
        self.closing = False
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._all_closed: asyncio.Event | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def max_body(self) -> int:
        """The largest body any route takes (for requests not yet admitted)."""
        return self._max_body()

    def __call__(self) -> Connection:
        return Connection(self)

    def watch(self) -> None:
        """Look at the connections' deadlines every quarter of the timeout while any are open."""
        if self._sweeper is None:
            every = min(max(self.timeout / 4, 0.05), 1.0)
            self._sweeper = self.loop.call_later(every, self._sweep, every)

    def _sweep(self, every: float) -> None:
        self._sweeper = None
        now = self.loop.time()
        for connection in list(self.connections):
            deadline = connection.deadline
            if deadline is not None and now >= deadline:
                connection.expire()
        if self.connections:
            self._sweeper = self.loop.call_later(every, self._sweep, every)

    def forget(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()

    async def drain(
        self, stop_accepting: Callable[[], object], until: float, *, quiet: float = CLOSE_IDLE_AFTER
    ) -> None:
        """The end of a stop, in this order:

        - from now on every answer says `Connection: close` and its connection
          closes after it;
        - each connection idle now is closed once it has been idle for `quiet`
          (if its next request comes first, that is answered, and closes it);
        - then `stop_accepting()`: under socket activation new connections
          wait in systemd's queue for the next process;
        - the requests already read are answered, each connection closing
          after its last; one that opened meanwhile and sent nothing is closed
          once it has been idle for `quiet`;
        - at `until` (the loop's time) whatever is still open is aborted.
        """
        loop = self.loop
        self.closing = True
        self._all_closed = asyncio.Event()
        begun = loop.time()
        while (now := loop.time()) < until:
            wait = self._close_idle(now, quiet, since_before=begun)
            if wait is None:
                break
            await asyncio.sleep(min(wait, until) - now)
        stop_accepting()
        while self.connections and (now := loop.time()) < until:
            self._all_closed.clear()  # set by forget() once none is left
            wait = self._close_idle(now, quiet)
            if not self.connections:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), min(wait or until, until) - now)
        for connection in list(self.connections):
            connection.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _close_idle(
        self, now: float, quiet: float, since_before: float | None = None
    ) -> float | None:
        """Close the connections idle for `quiet` (only those idle `since_before`
        that time, when given); when the next of the others may be closed, or
        None when none is idle."""
        soonest: float | None = None
        for connection in list(self.connections):
            since = connection.idle_since
            if since is None or (since_before is not None and since >= since_before):
                continue
            if now - since >= quiet:
                connection.close_idle()
            elif soonest is None or since + quiet < soonest:
                soonest = since + quiet
        return soonest
