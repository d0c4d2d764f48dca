"""relay's own transport: an HTTP/1.1 client, keep-alive connections over llhttp.

aiohttp's client builds request, response, stream, timer and connector
objects for every use relay has no need of (cookies, streaming uploads,
decompression), and that is most of its CPU a request (the figures:
bench/RESULTS.md, and docs/develop.md's scope). relay sends one body it
holds in memory and keeps at most RESPONSE_EXCERPT_BYTES of the answer, so a
request is one write and a parser fed what arrives. URLs are read by yarl, as
aiohttp reads them, and TLS is the standard library's verified default (or a
target's own CA, client certificate). A proxy is an HTTP one: an https URL is
tunnelled with CONNECT, an http one sent to the proxy in absolute form.

A transport (relay.targets.outbound.transport): what a request means, where
a redirect may go and which headers a hop carries are the policy's
(relay.targets.outbound.policy). What it may raise is drawn there too.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import select
import socket
import ssl
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast
from urllib.parse import unquote

import aiohappyeyeballs
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from relay.targets.outbound.transport import (
    Answer,
    BadAnswer,
    ConnectError,
    NoAnswer,
    ProxyError,
    Request,
    RequestError,
    TLSError,
)

# An idle kept-alive connection is closed after this long: shorter than most
# servers keep theirs (Node's and uvicorn's 5 s, Apache's 5 s), so relay is
# the one that hangs up, not a server while a request is on its way. A
# server quicker than that is met by the check before reuse and the one
# retry on a fresh connection (Client.request).
KEEPALIVE_SECONDS = 4.0
DNS_TTL_SECONDS = 10.0
# Between two address families' connection attempts (RFC 8305's 250 ms).
HAPPY_EYEBALLS_DELAY = 0.25
# An answer's head (status line, headers, 1xx answers before it, trailers
# after a chunked body) is held in memory until it ends: a target that never
# ends it is refused past these, aiohttp's limits (128 headers of 8190 bytes)
# or near them.
MAX_HEADERS = 128
MAX_HEAD_BYTES = 64 * 1024
# A request a server must take as safe to receive twice: an idempotent
# method (RFC 9110 section 9.2.2), or one carrying an idempotency key, which
# Go's net/http takes as saying so of a POST (Request.isReplayable). Every
# http target's request carries one (relay.targets.base.relay_headers).
_REPLAYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_REPLAY_HEADERS = ("idempotency-key", "x-idempotency-key")


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy: where it listens, and its Proxy-Authorization if any."""

    host: str
    port: int
    authorization: str | None = None

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """From "http://user:password@host:port" (the port 80 when left out)."""
        try:
            parsed = URL(url)
        except ValueError:
            parsed = None
        if parsed is None or parsed.scheme != "http" or not parsed.raw_host:
            # Never the URL itself in the message: it holds the password.
            raise RequestError("a proxy is an http://[user:password@]host:port URL")
        return cls(parsed.raw_host, parsed.port or 80, _basic(parsed))


def _basic(url: URL) -> str | None:
    if url.user is None:
        return None
    pair = f"{url.user}:{url.password or ''}".encode()
    return "Basic " + base64.b64encode(pair).decode()


@dataclass(frozen=True, slots=True)
class _Origin:
    """What a URL resolves to on the wire, worked out once per URL string."""

    key: tuple[str, str, int]  # (scheme, host, port): the pool a connection belongs to
    host: str
    port: int
    tls: bool
    target: str  # the request line's path and query, percent-encoded
    host_header: str
    absolute: str  # the URL without its user:password, for a proxy's request line


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
    target = parsed.raw_path_qs or "/"
    return _Origin(
        key=(parsed.scheme, host, port),
        host=host,
        port=port,
        tls=parsed.scheme == "https",
        target=target,
        host_header=host_header,
        absolute=f"{parsed.scheme}://{host_header}{target}",
    )


def environment_proxy(url: str, environ: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy HTTPS_PROXY or HTTP_PROXY names for `url` (lower case first,
    as curl reads them), None when there is none or NO_PROXY exempts its host."""
    environ = os.environ if environ is None else environ
    origin = _origin(url)
    scheme = "https" if origin.tls else "http"
    wanted = f"{scheme}_proxy"
    found = environ.get(wanted) or environ.get(wanted.upper())
    if not found:
        return None
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    # urllib's reading of NO_PROXY: "*", host names and their subdomains,
    # with or without a port (httpx and aiohttp's trust_env read it alike).
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if no_proxy and bypass(origin.host_header, {"no": no_proxy}):
        return None
    if "://" not in found:  # "proxy.corp:3128", as curl takes it
        found = "http://" + found
    try:
        return Proxy.parse(found)
    except RequestError:
        # Retried: the deliveries wait while the environment is put right.
        raise ProxyError(
            f"{wanted.upper()} in relay's environment is not an http://host:port proxy"
        ) from None


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    # The certificate store costs ~2.5 MiB a context: aiohttp's own (imported
    # for the admin listener anyway) is shared when it has one.
    import aiohttp.connector

    shared = getattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", None)
    return shared if isinstance(shared, ssl.SSLContext) else ssl.create_default_context()


_Key = tuple[tuple[str, str, int], Proxy | None]

# The proxy taken from the environment, the default: `proxy=ENVIRONMENT`.
ENVIRONMENT = "environment"


class Client:
    """A target's connections: kept alive per origin, at most `keep` idle ones each."""

    def __init__(
        self,
        keep: int,
        *,
        tls: ssl.SSLContext | None = None,
        proxy: Proxy | str | None = None,
    ) -> None:
        """`tls`: the context https URLs are verified with (the system's trusted
        certificates by default). `proxy`: every request through that one,
        ENVIRONMENT for what HTTPS_PROXY, HTTP_PROXY and NO_PROXY say per URL
        (read once per URL), None for none."""
        self._keep = keep
        self._tls = tls
        self._proxy = proxy
        self._proxies: dict[str, Proxy | bool | None] = {}
        self._idle: dict[_Key, list[_Connection]] = {}
        self._resolver = _Resolver()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    def _proxy_for(self, url: str) -> Proxy | None:
        if self._proxy != ENVIRONMENT:
            return cast(Proxy | None, self._proxy)
        found = self._proxies.get(url, False)
        if found is False:
            if len(self._proxies) > 256:
                self._proxies.clear()
            found = self._proxies[url] = environment_proxy(url)
        return cast(Proxy | None, found)

    async def send(
        self,
        request: Request,
        *,
        keep: int,
        body_by: Callable[[], float] | None = None,
        before_write: Callable[[], Awaitable[None]] | None = None,
    ) -> Answer:
        """Transport.send: see relay.targets.outbound.transport."""
        return await self.request(
            request.method,
            request.url,
            request.headers,
            request.body,
            keep=keep,
            body_by=body_by,
            before_write=before_write,
        )

    async def request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes,
        *,
        keep: int,
        body_by: Callable[[], float] | None = None,
        before_write: Callable[[], Awaitable[None]] | None = None,
    ) -> Answer:
        """Send one request; the answer with at most `keep` bytes of its body.

        `before_write` is awaited once, with the connection open, right before
        the request is first written (a paced target's turn). `body_by` gives,
        once it is written, the loop's time until which a body is waited for
        after the status came; the answer is returned with what came of it
        (`whole` False): a target that said 200 and stalls its body took the
        request. Raises a ClientError (see the module's docstring).
        """
        turn = before_write

        async def written_by(connection: _Connection) -> float | None:
            nonlocal turn
            if turn is not None:
                wait, turn = turn, None
                try:
                    await wait()
                except BaseException:
                    connection.close()
                    raise
            return body_by() if body_by is not None else None

        if self._closed:
            raise RequestError("client is closed")
        origin = _origin(url)
        proxy = self._proxy_for(url)
        relayed = proxy is not None and not origin.tls  # the proxy reads the request itself
        data = _head(method, origin, headers, len(body), proxy if relayed else None)
        if body:
            data += body
        key: _Key = (origin.key, proxy)
        connection = self._idle_connection(key)
        if connection is not None:
            by = await written_by(connection)
            try:
                return await self._exchange(key, connection, data, keep, by)
            except NoAnswer as error:
                # A kept-alive connection the server closed as the request
                # went out (an idle timeout met half-way): tried once more on a
                # new connection when no byte of an answer came and the server
                # cannot have read it, or may read it twice (see replayable).
                if error.heard or (error.written and not replayable(method, headers)):
                    raise
        try:
            connection = await _connect(origin, self._resolver, self._tls, proxy)
        except OSError as error:  # anything else the system says of a new connection
            raise ConnectError(origin.host, origin.port, why(error)) from None
        return await self._exchange(key, connection, data, keep, await written_by(connection))

    async def _exchange(
        self, key: _Key, connection: _Connection, data: bytes, keep: int, body_by: float | None
    ) -> Answer:
        try:
            answer = await connection.exchange(data, keep, body_by)
        except BaseException:
            connection.close()  # a cancelled or failed exchange's connection is done
            raise
        if connection.reusable:
            self._put_back(key, connection)
        else:
            connection.close()
        return answer

    def _idle_connection(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable(now):
                return connection
            connection.close()
        return None

    def _put_back(self, key: _Key, connection: _Connection) -> None:
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
            fresh = [c for c in idle if c.open and now - c.idle_since < KEEPALIVE_SECONDS]
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


def replayable(method: str, headers: Mapping[str, str]) -> bool:
    if method in _REPLAYABLE_METHODS:
        return True
    return any(name.lower() in _REPLAY_HEADERS for name in headers)


# Worked out by a transport from the body and the URL, whatever the config's
# headers say: every transport leaves these out of what it is given.
FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})


def _head(
    method: str, origin: _Origin, headers: dict[str, str], length: int, proxy: Proxy | None
) -> bytes:
    """The request's head; `proxy` when an http URL goes to one, which takes
    the whole URL in the request line (RFC 9112 section 3.2.2)."""
    target = origin.target if proxy is None else origin.absolute
    lines = [f"{method} {target} HTTP/1.1"]
    given = {name.lower() for name in headers}
    if "host" not in given:  # a configured Host (a virtual host behind an IP) wins
        lines.append(f"Host: {origin.host_header}")
    if "accept" not in given:
        lines.append("Accept: */*")
    problem = unsendable(headers)
    if problem is not None:
        raise RequestError(problem)
    for name, value in headers.items():
        if name.lower() not in FRAMING:
            lines.append(f"{name}: {value}")
    if proxy is not None and proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    # Every request says its length, GET and DELETE included: no chunked
    # uploads, and no server left waiting for a body that is not coming.
    lines.append(f"Content-Length: {length}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("ascii")


def unsendable(headers: Mapping[str, str]) -> str | None:
    """Why these headers cannot be written, None when they can: a line break
    or a colon where it would start another header, or a non-ASCII character
    (RFC 9110 section 5.5: a value is ASCII; other bytes are obs-text, which
    many servers refuse, and no encoding of them is agreed on). The last word
    of every transport, whatever the policy let through."""
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            return f"header {name!r} cannot be sent: it holds a line break or colon"
        if not (name.isascii() and value.isascii()):
            return f"header {name!r} cannot be sent: it holds a non-ASCII character"
    return None


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


async def _connect(
    origin: _Origin, resolver: _Resolver, tls: ssl.SSLContext | None, proxy: Proxy | None
) -> _Connection:
    """A new connection: the name resolved, its addresses raced (happy
    eyeballs, as aiohttp does: a VPS whose IPv6 route is broken still reaches
    a dual-stack CRM over IPv4), then TLS when the URL says https. Through a
    proxy: the connection is the proxy's, and an https URL's is tunnelled
    (CONNECT) before TLS is spoken to the target through it."""
    loop = asyncio.get_running_loop()
    host, port = (origin.host, origin.port) if proxy is None else (proxy.host, proxy.port)
    try:
        addresses = await resolver.addresses(host, port)
    except OSError as error:  # socket.gaierror: the name did not resolve
        if proxy is not None:
            raise ProxyError(f"proxy {host}: DNS lookup failed") from None
        raise ConnectError(host, port, error.strerror or str(error), dns=True) from None
    try:
        sock = await aiohappyeyeballs.start_connection(
            addresses, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY
        )
    except OSError as error:
        if proxy is not None:
            raise ProxyError(f"cannot connect to proxy {host}:{port}: {why(error)}") from None
        raise ConnectError(host, port, why(error)) from None
    try:
        if proxy is not None and origin.tls:
            await _tunnel(sock, origin, proxy)
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
        raise ConnectError(origin.host, origin.port, why(error)) from None
    except BaseException:
        sock.close()
        raise
    return connection


async def _tunnel(sock: socket.socket, origin: _Origin, proxy: Proxy) -> None:
    """CONNECT host:port through the proxy on `sock` (RFC 9110 section 9.3.6);
    returns once the proxy said 2xx, the socket then a pipe to the target."""
    loop = asyncio.get_running_loop()
    where = f"proxy {proxy.host}:{proxy.port}"
    bare = origin.host.partition("%")[0]
    authority = f"[{bare}]:{origin.port}" if ":" in bare else f"{bare}:{origin.port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    head = b""
    try:
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
        while b"\r\n\r\n" not in head:
            chunk = await loop.sock_recv(sock, 4096)
            if not chunk:
                raise ProxyError(f"{where} closed the connection on CONNECT")
            head += chunk
            if len(head) > MAX_HEAD_BYTES:
                raise ProxyError(f"{where}: its answer to CONNECT never ends")
    except OSError as error:
        raise ProxyError(f"{where}: {why(error)}") from None
    if not head.endswith(b"\r\n\r\n"):
        # The target speaks only after the TLS hello: bytes past the proxy's
        # answer are not the target's, and TLS would read them as its own.
        raise ProxyError(f"{where}: bytes after its answer to CONNECT")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if (
        len(parts) < 2
        or not parts[0].startswith("HTTP/1.")
        or not (parts[1].isascii() and parts[1].isdigit())
    ):
        raise ProxyError(f"{where}: not an HTTP answer to CONNECT")
    status = int(parts[1])
    if not 200 <= status < 300:
        said = f"HTTP {status}" + (" (proxy credentials refused)" if status == 407 else "")
        raise ProxyError(f"{where} refused CONNECT {authority}: {said}")


def why(error: OSError) -> str:
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
        self._body_by: float | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._head_size = 0
        self._status = 0
        self._headers_done = False
        self._complete = False
        self._heard = False
        self._quiet: select.poll | None = None
        self.open = False
        self.reusable = False
        self.idle_since = 0.0

    # The request

    def exchange(self, request: bytes, keep: int, body_by: float | None) -> asyncio.Future[Answer]:
        self._answer = asyncio.get_running_loop().create_future()
        if self._transport is None:  # closed by the server since it was taken
            self._answer.set_exception(NoAnswer(written=False))
            return self._answer
        self._keep = keep
        self._body_by = body_by
        self._headers, self._body, self._body_size, self._head_size = [], [], 0, 0
        self._status, self._headers_done, self._complete = 0, False, False
        self._heard = False
        self.reusable = False
        self._transport.write(request)
        return self._answer

    def usable(self, now: float) -> bool:
        """Still open, idle for less than KEEPALIVE_SECONDS, and quiet: an idle
        connection with something to read (the server's close, or bytes no
        request asked for) that the loop has not dispatched yet is not used:
        nothing was sent on it, so nothing is lost (urllib3 checks so too)."""
        if not self.open or now - self.idle_since >= KEEPALIVE_SECONDS:
            return False
        return self._quiet is None or not self._quiet.poll(0)

    def close(self) -> None:
        self.open = False
        self.reusable = False
        self._stop_waiting()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def _stop_waiting(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        """`body_by` passed with the status in hand: that is the answer."""
        self._stall = None
        self._finish(whole=False)
        self.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance.
        self._transport = cast(asyncio.Transport, transport)
        self.open = True
        sock = transport.get_extra_info("socket")
        if sock is not None:  # one poller a connection: asked before each reuse
            self._quiet = select.poll()
            self._quiet.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        self._heard = True
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
            answer.set_exception(NoAnswer(heard=self._heard))

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
        elif self._headers_done and self._body_by is not None:
            loop = asyncio.get_running_loop()
            self._stall = loop.call_at(self._body_by, self._stalled)

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

    def _finish(self, *, whole: bool = True) -> None:
        self._stop_waiting()
        answer = self._answer
        if answer is None or answer.done():
            return
        # Reused only after a whole answer the server means to keep alive.
        self.reusable = self.open and self._complete and self._parser.should_keep_alive()
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        answer.set_result(Answer(self._status, headers, b"".join(self._body), whole))
        self._answer = None
        if not self.reusable and self._transport is not None:
            self._transport.close()

    def _fail(self, error: Exception) -> None:
        self._stop_waiting()
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(error)
        self._answer = None
        self.close()
