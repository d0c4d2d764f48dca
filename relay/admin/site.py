"""The admin listener's site: aiohttp's TCPSite behind a ConnectionCap.

Kept apart from relay.ingress.guard, which runs compiled on the ingress's
hot path, because mypyc cannot subclass TCPSite (a class with __slots__).
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from relay.ingress.guard import ConnectionCap
from relay.ops.systemd import BACKLOG


class CappedSite(web.TCPSite):
    """aiohttp's TCPSite with the runner's protocol factory wrapped in a ConnectionCap;
    on `sock` (a listening socket systemd passed) rather than `host` and `port`
    when given."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limit: int,
        name: str,
        head_timeout: float | None = None,
        probes: bool = False,
        sock: socket.socket | None = None,
    ):
        super().__init__(runner, host, port, backlog=BACKLOG)
        self._sock = sock
        self._cap_limit = limit
        self._cap_name = name
        self._head_timeout = head_timeout
        self._probes = probes
        self.cap: ConnectionCap | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self.cap = ConnectionCap(
            server,
            self._cap_limit,
            self._cap_name,
            head_timeout=self._head_timeout,
            probes=self._probes,
        )
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            self._server = await loop.create_server(
                self.cap, sock=self._sock, backlog=self._backlog
            )
        else:
            self._server = await loop.create_server(
                self.cap, self._host, self._port, backlog=self._backlog
            )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
