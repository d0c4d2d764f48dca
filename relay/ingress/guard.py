"""A cap on the connections each listener holds open, for relay with nothing in front.

Without one, 400 idle sockets under `ulimit -n 256` used up every file
descriptor: webhooks failed, /healthz was unreachable, SQLite could not open
its files. Each listener gets a share of the descriptor limit; when a new
connection would go past it, the connection that has been quiet longest
(connected and sent nothing, or idle between keep-alive requests, for at
least QUIET_SECONDS; never one whose request is being handled) is closed to
make room. When every connection is busy, the new one is answered 503 with
Retry-After and closed.

Trickling defeats "quiet": a client sending one byte of its head every half
second is never quiet, and 200 of them held every slot. So, when full, the
connection whose head has been incomplete longest (for at least HEAD_GRACE:
a sender's head comes in one packet) is closed next; one address may hold at
most half the slots (`per_address`), and past that its own connections make
room for it (its oldest incomplete head, however young: its tricklers close
each other's as they reconnect, so a grace would refuse a prompt sender on
their address, behind the same NAT); and a head must be complete within
`head_timeout` of its first byte (ingress's relay.ingress.http1 has its own
deadline; the admin listener's aiohttp has none for a trickled head). A
health probe (`GET /healthz`, `/readyz`) that finds every slot busy is still
answered: it waits in a small lane of its own (PROBE_LANE connections,
PROBE_SECONDS to say what it wants) instead of getting 503.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, cast

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
# A head incomplete this long may be closed to make room (oldest first).
HEAD_GRACE = 0.25
# Slots one address may hold: half of them, and all of a small cap.
SMALL_CAP = 16
# Health probes over the cap: how many may wait to be read, and how long.
PROBE_LANE = 8
PROBE_SECONDS = 2.0
_PROBES = (b"GET /healthz", b"GET /readyz", b"HEAD /healthz", b"HEAD /readyz")
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


_ANY = object()  # any address


class ConnectionCap:
    """A protocol factory around aiohttp's: counts connections, makes room past the cap."""

    def __init__(
        self,
        factory: Any,
        limit: int,
        name: str,
        *,
        head_timeout: float | None = None,
        probes: bool = False,
    ) -> None:
        self._factory = factory
        self.limit = limit
        self.per_address = limit if limit <= SMALL_CAP else max(SMALL_CAP, limit // 2)
        self._name = name
        self._head_timeout = head_timeout
        self._probes = probes
        self._open: dict[_Counted, None] = {}  # in order of last activity, quietest first
        self._heads: dict[_Counted, None] = {}  # heads being received, oldest first
        self._by_address: dict[str | None, int] = {}
        self._lane: dict[_Counted, None] = {}  # health probes over the cap, being read
        self._over: dict[_Counted, None] = {}  # admitted from the lane: one request each
        self._sweeper: asyncio.TimerHandle | None = None
        self.refused = 0
        self.evicted = 0

    def __call__(self) -> asyncio.Protocol:
        return _Counted(self, self._factory())

    def _quietest(self, address: object = _ANY) -> _Counted | None:
        """The connection quiet longest, unless it is in the middle of a request
        (a body received, its commit awaited): those are never closed."""
        now = time.monotonic()
        for looked, connection in enumerate(self._open):
            if looked >= 64 or now - connection.touched_at < QUIET_SECONDS:
                return None  # in order of touched_at: the rest were active later still
            if address is not _ANY and connection.address != address:
                continue
            if now - connection.active_at >= QUIET_SECONDS and not connection.in_request:
                return connection
        return None

    def _slowest_head(self, address: object = _ANY, grace: float = HEAD_GRACE) -> _Counted | None:
        """The connection whose head has been incomplete longest (past `grace`)."""
        now = time.monotonic()
        for connection in list(self._heads):
            if not connection.receiving_head:  # its head came after all
                connection.head_done()
                continue
            if now - connection.head_since < grace:
                return None  # oldest first: the rest began later still
            if address is _ANY or connection.address == address:
                return connection
        return None

    def _make_room(self, address: object = _ANY) -> bool:
        # An address at its own cap gives up its oldest incomplete head however
        # young: tricklers sharing a sender's address close each other's heads
        # as fast as they reconnect, so none outlives HEAD_GRACE, and a grace
        # would refuse the sender rather than a trickler. Oldest first, a
        # prompt sender's head (complete in a packet or two) is not chosen
        # while tricklers hold older ones. Across addresses the grace stays:
        # 503 and Retry-After to the newcomer beats cutting another client's
        # head in flight.
        grace = HEAD_GRACE if address is _ANY else 0.0
        victim = self._quietest(address) or self._slowest_head(address, grace)
        if victim is None:
            return False
        self.evicted += 1
        victim.close()
        return True

    def _admit(self, connection: _Counted) -> bool | None:
        """True: admitted; False: refused; None: a health probe may wait in the lane."""
        address = connection.address
        if (
            self._by_address.get(address, 0) >= self.per_address and not self._make_room(address)
        ) or (len(self._open) >= self.limit and not self._make_room()):
            return None if self._probes else self._refuse()
        self._count(connection)
        return True

    def _count(self, connection: _Counted) -> None:
        self._open[connection] = None
        self._by_address[connection.address] = self._by_address.get(connection.address, 0) + 1
        self.watch()

    def _refuse(self) -> bool:
        self.refused += 1
        if self.refused % 100 == 1:
            log.warning(
                "%s: %d connections open (the limit): refusing new ones with 503 (%d so far)",
                self._name,
                self.limit,
                self.refused,
            )
        return False

    def _wait_in_lane(self, connection: _Counted) -> bool:
        if len(self._lane) >= PROBE_LANE:
            oldest = next(iter(self._lane))
            oldest.refuse()
        self._lane[connection] = None
        connection.lane_until = time.monotonic() + PROBE_SECONDS
        self.watch()
        return True

    def _from_lane(self, connection: _Counted, data: bytes) -> bool:
        """A lane connection's first bytes: a health probe goes in over the cap."""
        del self._lane[connection]
        if not data.startswith(_PROBES):
            self._refuse()
            return False
        if len(self._over) >= PROBE_LANE:
            next(iter(self._over)).close()
        self._over[connection] = None
        self._count(connection)
        return True

    def _touch(self, connection: _Counted) -> None:
        if connection in self._open:
            del self._open[connection]
            self._open[connection] = None

    def _head_began(self, connection: _Counted) -> None:
        self._heads[connection] = None

    def _head_ended(self, connection: _Counted) -> None:
        self._heads.pop(connection, None)

    def _forget(self, connection: _Counted) -> None:
        self._lane.pop(connection, None)
        self._over.pop(connection, None)
        self._heads.pop(connection, None)
        if self._open.pop(connection, _ANY) is not _ANY:
            left = self._by_address[connection.address] - 1
            if left:
                self._by_address[connection.address] = left
            else:
                del self._by_address[connection.address]

    def watch(self) -> None:
        """Look for heads past their deadline, and probes that said nothing,
        every quarter of a second while any may be."""
        if self._sweeper is None and (
            self._lane or self._over or (self._head_timeout and self._heads)
        ):
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(0.25, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        for connection in list(self._lane):
            if now >= connection.lane_until:
                connection.refuse()
        for connection in list(self._over):
            # Past the cap for its probe only: closed once answered (a
            # connection kept open there would hold a descriptor the cap does not count).
            if not connection.in_request:
                connection.close()
        if self._head_timeout is not None:
            for connection in list(self._heads):
                if now - connection.head_since < self._head_timeout:
                    break  # oldest first
                if connection.receiving_head:
                    connection.close()
                else:
                    connection.head_done()
        self.watch()


class _Counted(asyncio.Protocol):
    """Passes everything through to aiohttp's protocol; notes when bytes arrive."""

    def __init__(self, cap: ConnectionCap, inner: asyncio.Protocol) -> None:
        self._cap = cap
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._admitted = False
        self._in_lane = False
        self.address: str | None = None
        self.active_at = self.touched_at = time.monotonic()  # touched: moved last in the cap
        self.head_since = 0.0  # when the head being received began (in cap._heads)
        self._in_head = False
        self.lane_until = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else None
        admitted = self._cap._admit(self)
        if admitted is None:
            self._in_lane = self._cap._wait_in_lane(self)
            return
        if not admitted:
            self.refuse()
            return
        self._admitted = True
        self._inner.connection_made(transport)

    def refuse(self) -> None:
        """503 and close: no room for this connection."""
        self._cap._forget(self)
        self._in_lane = False
        if self._transport is not None:
            self._transport.write(_BUSY)
            self._transport.close()

    @property
    def in_request(self) -> bool:
        # Ingress's own protocol (relay.ingress.http1) says whether a request is being
        # handled; aiohttp's (the admin listener) says so only in private
        # attributes (aiohttp 3.9 to 3.14 at least): a request being handled,
        # or parsed and waiting for its handler.
        own = getattr(self._inner, "in_request", None)
        if own is not None:
            return bool(own)
        return bool(
            getattr(self._inner, "_request_in_progress", False)
            or getattr(self._inner, "_messages", None)
        )

    def head_done(self) -> None:
        self._in_head = False
        self._cap._head_ended(self)

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
        if not self._admitted and not self._in_lane:
            return  # refused: closing, and its protocol never began
        if self._in_lane:
            self._in_lane = False
            if not self._cap._from_lane(self, data):
                self.refuse()
                return
            self._admitted = True
            assert self._transport is not None
            self._inner.connection_made(self._transport)
        now = self.active_at = time.monotonic()
        if now - self.touched_at >= TOUCH_EVERY:
            # The cap's order of activity only needs to be right to within a
            # fraction of QUIET_SECONDS: not a reordering on every read.
            self.touched_at = now
            self._cap._touch(self)
        if not self._in_head and not self.in_request:
            self._in_head = True  # a head begins (or, after a request, the next one)
            self.head_since = now
            self._cap._head_began(self)
        self._inner.data_received(data)
        if self._in_head and not self.receiving_head:
            self.head_done()

    @property
    def receiving_head(self) -> bool:
        """Whether a head is still incomplete: ingress's protocol knows; of
        aiohttp's, a head is complete once its request is handled or queued."""
        own = getattr(self._inner, "receiving_head", None)
        if own is not None:
            return bool(own)
        return not self.in_request

    def eof_received(self) -> bool | None:
        if not self._admitted:
            return None
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cap._forget(self)
        if self._admitted:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()
