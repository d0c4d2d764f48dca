"""A cap on the connections each listener holds open, for relay with nothing in front.

Without one, 400 idle sockets under `ulimit -n 256` used up every file
descriptor: webhooks failed, /healthz was unreachable, SQLite could not open
its files. Each listener gets a share of the descriptor limit; when a new
connection would go past it, the connection that has been quiet longest
(connected and sent nothing, or idle between keep-alive requests, for at
least QUIET_SECONDS; never one whose request is being handled) is closed to
make room. When every connection is busy, the new one is answered 503 with
Retry-After and closed.

Connections that send nothing, or never finish their headers, are closed by
aiohttp's keep-alive timer, which also runs from the moment a connection
opens (relay sets it to `server.read_timeout`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("relay.http")

# Descriptors kept for everything but listeners: the database (file, WAL and
# shared memory per connection), the lock, target connections, logs.
RESERVED_DESCRIPTORS = 96
MAX_INGRESS_CONNECTIONS = 4096
MAX_ADMIN_CONNECTIONS = 64
# A connection silent this long may be closed to make room for a new one.
QUIET_SECONDS = 1.0
TOUCH_EVERY = QUIET_SECONDS / 8
RETRY_AFTER_SECONDS = 5
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Type: application/json\r\n"
    b'Connection: close\r\nContent-Length: 34\r\n\r\n{"error":"too many connections"}\r\n'
    % RETRY_AFTER_SECONDS
)


def connection_limits() -> tuple[int, int]:
    """(ingress, admin) connection caps from this process's descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    admin = max(4, min(MAX_ADMIN_CONNECTIONS, soft // 16))
    ingress = max(8, min(MAX_INGRESS_CONNECTIONS, soft - RESERVED_DESCRIPTORS - admin))
    return ingress, admin


class ConnectionCap:
    """A protocol factory around aiohttp's: counts connections, makes room past the cap."""

    def __init__(self, factory: Any, limit: int, name: str) -> None:
        self._factory = factory
        self.limit = limit
        self._name = name
        self._open: dict[_Counted, None] = {}  # in order of last activity, quietest first
        self.refused = 0
        self.evicted = 0

    def __call__(self) -> asyncio.Protocol:
        return _Counted(self, self._factory())

    def _quietest(self) -> _Counted | None:
        """The connection quiet longest, unless it is in the middle of a request
        (a body received, its commit awaited): those are never closed."""
        now = time.monotonic()
        for looked, connection in enumerate(self._open):
            if looked >= 64 or now - connection.touched_at < QUIET_SECONDS:
                return None  # in order of touched_at: the rest were active later still
            if now - connection.active_at >= QUIET_SECONDS and not connection.in_request:
                return connection
        return None

    def _admit(self, connection: _Counted) -> bool:
        if len(self._open) >= self.limit:
            quietest = self._quietest()
            if quietest is None:
                self.refused += 1
                if self.refused % 100 == 1:
                    log.warning(
                        "%s: %d connections open (the limit): refusing new ones with 503"
                        " (%d so far)",
                        self._name,
                        self.limit,
                        self.refused,
                    )
                return False
            self.evicted += 1
            quietest.close()
        self._open[connection] = None
        return True

    def _touch(self, connection: _Counted) -> None:
        if connection in self._open:
            del self._open[connection]
            self._open[connection] = None

    def _forget(self, connection: _Counted) -> None:
        self._open.pop(connection, None)


class _Counted(asyncio.Protocol):
    """Passes everything through to aiohttp's protocol; notes when bytes arrive."""

    def __init__(self, cap: ConnectionCap, inner: asyncio.Protocol) -> None:
        self._cap = cap
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._admitted = False
        self.active_at = self.touched_at = time.monotonic()  # touched: moved last in the cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        if not self._cap._admit(self):
            self._transport.write(_BUSY)
            self._transport.close()
            return
        self._admitted = True
        self._inner.connection_made(transport)

    @property
    def in_request(self) -> bool:
        # Ingress's own protocol (relay.http1) says whether a request is being
        # handled; aiohttp's (the admin listener) says so only in a private
        # attribute (aiohttp 3.9 to 3.14 at least).
        own = getattr(self._inner, "in_request", None)
        if own is not None:
            return bool(own)
        return bool(getattr(self._inner, "_request_in_progress", False))

    def close(self) -> None:
        self._cap._forget(self)
        transport = self._transport
        if transport is None:
            return
        if transport.get_write_buffer_size():
            # Quiet, and its client has not taken its answers: close() would wait
            # for that, holding the descriptor this was to free.
            transport.abort()
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        now = self.active_at = time.monotonic()
        if now - self.touched_at >= TOUCH_EVERY:
            # The cap's order of activity only needs to be right to within a
            # fraction of QUIET_SECONDS: not a reordering on every read.
            self.touched_at = now
            self._cap._touch(self)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cap._forget(self)
        if self._admitted:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class CappedSite(web.TCPSite):
    """aiohttp's TCPSite with the runner's protocol factory wrapped in a ConnectionCap."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, limit: int, name: str):
        super().__init__(runner, host, port, backlog=1024)
        self._cap_limit = limit
        self._cap_name = name
        self.cap: ConnectionCap | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self.cap = ConnectionCap(server, self._cap_limit, self._cap_name)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.cap, self._host, self._port, backlog=self._backlog
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
