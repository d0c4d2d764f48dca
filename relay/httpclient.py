"""The HTTP/1.1 client targets deliver with: keep-alive connections over llhttp.

aiohttp's client cost ~88 us of CPU a request here against ~33 for this one
(bench/end_to_end.py's sink, 32 at once, one core): its request, response,
stream, timer and connector objects are built for every use relay has no
need of: cookies, redirects, proxies, streaming uploads, decompression.
relay sends one body it holds in memory and keeps at most
RESPONSE_EXCERPT_BYTES of the answer, so a request is one write and a
parser fed what arrives. URLs are read by yarl, as aiohttp reads them, and
TLS is the standard library's verified default.

Time limits are the caller's (the scheduler wraps each attempt in one):
cancelling a request closes its connection, never returns it to the pool.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast
from urllib.parse import unquote

import aiohappyeyeballs
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

# An idle kept-alive connection is closed after this long (aiohttp's default):
# most servers close theirs sooner, and an old one is likelier to be stale.
KEEPALIVE_SECONDS = 15.0
DNS_TTL_SECONDS = 10.0
# Between two address families' connection attempts (RFC 8305's 250 ms).
HAPPY_EYEBALLS_DELAY = 0.25
# An answer's head (status line, headers, 1xx answers before it, trailers
# after a chunked body) is held in memory until it ends: a target that never
# ends it is refused past these, aiohttp's limits (128 headers of 8190 bytes)
# or near them.
MAX_HEADERS = 128
MAX_HEAD_BYTES = 64 * 1024


class RequestError(Exception):
    """The request cannot be made as asked (a header with a line break...)."""


class ConnectError(OSError):
    """No connection to host:port; `reason` says why, `dns` when the name did not resolve."""

    def __init__(self, host: str, port: int, reason: str, *, dns: bool = False) -> None:
        super().__init__(reason)
        self.host = host
        self.port = port
        self.reason = reason
        self.dns = dns


class TLSError(Exception):
    """The TLS handshake failed (certificate, protocol)."""


class NoAnswer(Exception):
    """The server closed the connection before its answer's headers."""


class BadAnswer(Exception):
    """What came back is not HTTP/1.x."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    excerpt: bytes  # at most the `keep` bytes asked for; the rest never read


@dataclass(frozen=True, slots=True)
class _Origin:
    """What a URL resolves to on the wire, worked out once per URL string."""

    key: tuple[str, str, int]  # (scheme, host, port): the pool a connection belongs to
    host: str
    port: int
    tls: bool
    target: str  # the request line's path and query, percent-encoded
    host_header: str
    authorization: str | None  # Basic, from user:password in the URL


@lru_cache(maxsize=256)
def _origin(url: str) -> _Origin:
    try:
        parsed = URL(url)
    except ValueError as error:  # yarl: "Invalid IPv6 URL", "Port out of range"...
        raise RequestError(f"not a valid URL: {error}") from None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise RequestError(f"not an http(s) URL: {parsed.with_password(None)}")
    host = parsed.raw_host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if ":" in host and "%" in host:
        # An IPv6 address with its zone (fe80::1%25eth0 in a URL, RFC 6874
        # section 2): connected through the zone as the system names it
        # (fe80::1%eth0), and sent without it in Host, which section 4 asks of
        # a client: the zone means something on this machine only.
        host = unquote(host)
    bracketed = f"[{host.partition('%')[0]}]" if ":" in host else host
    host_header = bracketed if parsed.is_default_port() else f"{bracketed}:{port}"
    authorization = None
    if parsed.user is not None:
        pair = f"{parsed.user}:{parsed.password or ''}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode()
    return _Origin(
        key=(parsed.scheme, host, port),
        host=host,
        port=port,
        tls=parsed.scheme == "https",
        target=parsed.raw_path_qs or "/",
        host_header=host_header,
        authorization=authorization,
    )


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    # The certificate store costs ~2.5 MiB a context: aiohttp's own (imported
    # for the admin listener anyway) is shared when it has one.
    import aiohttp.connector

    shared = getattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", None)
    return shared if isinstance(shared, ssl.SSLContext) else ssl.create_default_context()


class Client:
    """A target's connections: kept alive per origin, at most `keep` idle ones each."""

    def __init__(self, keep: int, *, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: the context https URLs are verified with (the system's trusted
        certificates by default)."""
        self._keep = keep
        self._tls = tls
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._resolver = _Resolver()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes,
        *,
        keep: int,
        before_write: Callable[[], Awaitable[None]] | None = None,
    ) -> Answer:
        """Send one request; the answer with at most `keep` bytes of its body.

        `before_write` is awaited once the connection is open, right before
        the request is written (a paced target's turn).
        Raises RequestError, ConnectError, TLSError, NoAnswer or BadAnswer.
        """
        if self._closed:
            raise RequestError("client is closed")
        origin = _origin(url)
        head = _head(method, origin, headers, len(body))
        connection = self._idle_connection(origin.key) or await _connect(
            origin, self._resolver, self._tls
        )
        if before_write is not None:
            try:
                await before_write()
            except BaseException:
                connection.close()
                raise
        try:
            # A kept-alive connection the server closes as this goes out fails
            # as NoAnswer: a retry at the scheduler's pace, never a second
            # send here, for a server that read the request and then crashed
            # looks the same.
            answer = await connection.exchange(head + body if body else head, keep)
        except BaseException:
            connection.close()  # a cancelled or failed exchange's connection is done
            raise
        if connection.reusable:
            self._put_back(origin.key, connection)
        else:
            connection.close()
        return answer

    def _idle_connection(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable(now):
                return connection
            connection.close()
        return None

    def _put_back(self, key: tuple[str, str, int], connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self._keep or self._closed:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(KEEPALIVE_SECONDS, self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle for KEEPALIVE_SECONDS: one timer, not one per request."""
        self._sweeper = None
        now = time.monotonic()
        for key, idle in list(self._idle.items()):
            fresh = [c for c in idle if c.usable(now)]
            for connection in idle:
                if connection not in fresh:
                    connection.close()
            if fresh:
                self._idle[key] = fresh
            else:
                del self._idle[key]
        if self._idle:
            self._sweeper = asyncio.get_running_loop().call_later(KEEPALIVE_SECONDS, self._sweep)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


# Worked out here from the body and the URL, whatever the config's headers say.
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})


def _head(method: str, origin: _Origin, headers: dict[str, str], length: int) -> bytes:
    lines = [f"{method} {origin.target} HTTP/1.1"]
    given = {name.lower() for name in headers}
    if "host" not in given:  # a configured Host (a virtual host behind an IP) wins
        lines.append(f"Host: {origin.host_header}")
    if "accept" not in given:
        lines.append("Accept: */*")
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise RequestError(f"header {name!r} cannot be sent: it holds a line break or colon")
        if name.lower() not in _FRAMING:
            lines.append(f"{name}: {value}")
    if origin.authorization is not None and "authorization" not in given:
        lines.append(f"Authorization: {origin.authorization}")
    # Every request says its length, GET and DELETE included: no chunked
    # uploads, and no server left waiting for a body that is not coming.
    lines.append(f"Content-Length: {length}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8")


Addresses = list[tuple[Any, Any, int, str, tuple[Any, ...]]]


class _Resolver:
    """Names resolved once for every connection opened at the same moment, and
    kept DNS_TTL_SECONDS (aiohttp's defaults): a burst of 32 new connections
    is one lookup, not 32 queued in the resolver's threads."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int], tuple[float, Addresses]] = {}
        self._pending: dict[tuple[str, int], asyncio.Future[Addresses]] = {}

    async def addresses(self, host: str, port: int) -> Addresses:
        literal = _literal(host, port)
        if literal is not None:  # no lookup, no thread hop: aiohttp skips it too
            return literal
        key = (host, port)
        known = self._known.get(key)
        if known is not None and known[0] > time.monotonic():
            return known[1]
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._lookup(host, port))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        # Shielded: one waiter's time limit must not cancel the others' lookup.
        return await asyncio.shield(pending)

    async def _lookup(self, host: str, port: int) -> Addresses:
        loop = asyncio.get_running_loop()
        found = await loop.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        if len(self._known) > 64:  # targets have few hosts: never more than a handful
            self._known.clear()
        self._known[(host, port)] = (time.monotonic() + DNS_TTL_SECONDS, found)
        return found


def _literal(host: str, port: int) -> Addresses | None:
    """The address itself when the URL names one (`127.0.0.1`, `::1`), else None."""
    if "%" in host:  # a zone: the lookup turns its name into the interface's index
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    where: tuple[Any, ...] = (host, port, 0, 0) if address.version == 6 else (host, port)
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", where)]


async def _connect(origin: _Origin, resolver: _Resolver, tls: ssl.SSLContext | None) -> _Connection:
    """A new connection: the name resolved, its addresses raced (happy
    eyeballs, as aiohttp does: a VPS whose IPv6 route is broken still reaches
    a dual-stack CRM over IPv4), then TLS when the URL says https."""
    loop = asyncio.get_running_loop()
    try:
        addresses = await resolver.addresses(origin.host, origin.port)
    except OSError as error:  # socket.gaierror: the name did not resolve
        raise ConnectError(
            origin.host, origin.port, error.strerror or str(error), dns=True
        ) from None
    try:
        sock = await aiohappyeyeballs.start_connection(
            addresses, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY
        )
    except OSError as error:
        raise ConnectError(origin.host, origin.port, _why(error)) from None
    try:
        _, connection = await loop.create_connection(
            _Connection,
            sock=sock,
            ssl=(tls or _tls_context()) if origin.tls else None,
            # Without a fully qualified name's final dot, as aiohttp checks it:
            # no certificate names "crm.example.", and Python's check fails.
            server_hostname=origin.host.rstrip(".") if origin.tls else None,
        )
    except ssl.SSLError as error:
        sock.close()
        raise TLSError(error.reason or str(error)) from None
    except OSError as error:
        sock.close()
        raise ConnectError(origin.host, origin.port, _why(error)) from None
    except BaseException:
        sock.close()
        raise
    return connection


def _why(error: OSError) -> str:
    """ "Connection refused", not "Connect call failed ('127.0.0.1', 1)"."""
    if error.errno:
        return os.strerror(error.errno)
    return error.strerror or str(error) or type(error).__name__


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: a request written, its answer parsed as it comes."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[Answer] | None = None
        self._keep = 0
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._head_size = 0
        self._status = 0
        self._headers_done = False
        self._complete = False
        self.open = False
        self.reusable = False
        self.idle_since = 0.0

    # The request

    def exchange(self, request: bytes, keep: int) -> asyncio.Future[Answer]:
        self._answer = asyncio.get_running_loop().create_future()
        if self._transport is None:  # closed by the server since it was taken
            self._answer.set_exception(NoAnswer())
            return self._answer
        self._keep = keep
        self._headers, self._body, self._body_size, self._head_size = [], [], 0, 0
        self._status, self._headers_done, self._complete = 0, False, False
        self.reusable = False
        self._transport.write(request)
        return self._answer

    def usable(self, now: float) -> bool:
        """Still open, and idle for less than KEEPALIVE_SECONDS (kept in the pool)."""
        return self.open and now - self.idle_since < KEEPALIVE_SECONDS

    def close(self) -> None:
        self.open = False
        self.reusable = False
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance.
        self._transport = cast(asyncio.Transport, transport)
        self.open = True

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadAnswer("the server switched protocols"))
        except httptools.HttpParserError as error:
            if self._headers_done:
                # The status came (see _ended): a body llhttp cannot read on
                # does not undo it, and a retry would deliver again what the
                # target said it took. The connection is not reused.
                self._finish()
                self.close()
                return
            refused = error.__context__  # one our callbacks raised (too many headers)
            self._fail(
                refused
                if isinstance(refused, BadAnswer)
                else BadAnswer(str(error) or type(error).__name__)
            )
        else:
            # All but the body (on_body takes its bytes off): httptools holds a
            # header's or a trailer's partial value, 1xx answers and chunk
            # framing may come for ever.
            self._head_size += len(data)
            if self._answer is not None and self._head_size > MAX_HEAD_BYTES:
                if self._headers_done:  # trailers: the status came (see _ended)
                    self._finish()
                    self.close()
                else:
                    self._fail(BadAnswer(f"the answer's head is over {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        self._ended()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.reusable = False
        self._transport = None
        self._ended(exc)

    def _ended(self, exc: Exception | None = None) -> None:
        self.open = False
        answer = self._answer
        if answer is None or answer.done():
            return
        if self._headers_done:
            # The status came: that is the target's answer, whatever became of
            # the body (one that runs until the connection closes ends here;
            # one cut short is kept as far as it came). Calling it a failure
            # would send again what the target said it took.
            self._finish()
            return
        if isinstance(exc, ssl.SSLError):
            answer.set_exception(TLSError(exc.reason or str(exc)))
        else:
            answer.set_exception(NoAnswer())

    # llhttp's callbacks

    def on_message_begin(self) -> None:
        if self._answer is None:
            # A second answer to one request, or the start of one, behind the
            # first: read on, the next request sent here would take it for its
            # own (a stale 200 for a delivery the target refused).
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self._headers) >= MAX_HEADERS:
            raise BadAnswer(f"the answer has over {MAX_HEADERS} headers")
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._headers_done = self._status >= 200
        if self._keep == 0 and self._headers_done:
            self._finish()

    def on_body(self, body: bytes) -> None:
        self._head_size -= len(body)
        if self._status < 200:
            return
        room = self._keep - self._body_size
        if len(body) > room:  # more than is kept: the rest is never read
            self._body.append(body[:room])
            self._body_size = self._keep
            self._finish()
        else:
            self._body.append(body)
            self._body_size += len(body)

    def on_message_complete(self) -> None:
        if self._status < 200:  # 100 Continue and the like: the answer follows
            self._headers = []
            return
        self._complete = True
        self._finish()

    def _finish(self) -> None:
        answer = self._answer
        if answer is None or answer.done():
            return
        # Reused only after a whole answer the server means to keep alive.
        self.reusable = self.open and self._complete and self._parser.should_keep_alive()
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        answer.set_result(Answer(self._status, headers, b"".join(self._body)))
        self._answer = None
        if not self.reusable and self._transport is not None:
            self._transport.close()

    def _fail(self, error: Exception) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(error)
        self._answer = None
        self.close()
