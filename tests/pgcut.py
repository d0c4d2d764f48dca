"""A stand-in for a PostgreSQL server's unix socket that passes everything
through, and when told to, breaks the connection that next commits *after*
the server has committed, before its answer reaches the client: the failure
a network or a server crash can cause at that moment, with real parts (a real
server, a real driver), at the one moment that matters.

Told to hold the COMMIT (`until`), it breaks the client's side first and
passes the COMMIT on only once `until` is set: the server still holds that
transaction open, its locks with it, while the client already tries again
(a network cut with the COMMIT on its way, a server slow to commit).

Told to go away with the cut (`away=True`), it also breaks every other
connection and refuses new ones until `come_back()`: the database out of
reach right after the COMMIT was lost, so that nobody can ask it what
became of that transaction until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

SOCKET_NAME = ".s.PGSQL.5432"  # the default port's: libpq's and asyncpg's naming
CHUNK = 65536


class CommitCutter:
    def __init__(self, server_socket_dir: Path, own_dir: Path) -> None:
        self._server = server_socket_dir / SOCKET_NAME
        self.socket_dir = own_dir
        self._armed = False
        self._until: asyncio.Event | None = None
        self._away_after_cut = False
        self.away = False  # every connection broken, new ones refused
        self.cut = 0  # connections broken after their COMMIT was answered
        self._pumps: set[asyncio.Task[None]] = set()
        self._open: set[asyncio.StreamWriter] = set()  # both sides of each connection

    def url(self, url: str) -> str:
        """`url` (one over the server's socket) through this stand-in instead."""
        parts = urlsplit(url)
        query = {key: values[0] for key, values in parse_qs(parts.query).items()}
        query["host"] = str(self.socket_dir)
        return urlunsplit(parts._replace(query=urlencode(query)))

    def cut_next_commit(self, *, until: asyncio.Event | None = None, away: bool = False) -> None:
        self._armed = True
        self._until = until
        self._away_after_cut = away

    def come_back(self) -> None:
        self.away = False

    def go_away(self) -> None:
        """The database out of reach now: every connection broken, new ones
        refused until `come_back()`."""
        self._go_away()

    def _go_away(self) -> None:
        self.away = True
        for side in list(self._open):
            side.close()  # each connection's pumps end with it

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[CommitCutter]:
        server = await asyncio.start_unix_server(self._serve, self.socket_dir / SOCKET_NAME)
        try:
            yield self
        finally:
            server.close()
            for pump in list(self._pumps):
                pump.cancel()
            await asyncio.gather(*self._pumps, return_exceptions=True)
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pumps.add(task)
        sides = [writer]
        if self.away:
            writer.close()
            self._pumps.discard(task)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(self._server)
            sides.append(upstream_writer)
            self._open.update(sides)
            committing = asyncio.Event()

            async def client_to_server() -> None:
                while chunk := await reader.read(CHUNK):
                    if self._armed and b"COMMIT" in chunk.upper():
                        self._armed = False
                        committing.set()
                        until, self._until = self._until, None
                        if until is not None:
                            writer.close()  # the client hears of the break now
                            await until.wait()
                            upstream_writer.write(chunk)
                            await upstream_writer.drain()
                            # The server's answer ends this connection (below).
                            await asyncio.Event().wait()
                    upstream_writer.write(chunk)
                    await upstream_writer.drain()

            async def server_to_client() -> None:
                while chunk := await upstream_reader.read(CHUNK):
                    if committing.is_set():
                        # The server answered the COMMIT: it is done. The
                        # client never hears it.
                        self.cut += 1
                        if self._away_after_cut:
                            self._away_after_cut = False
                            self._go_away()
                        return
                    writer.write(chunk)
                    await writer.drain()

            pumps = [
                asyncio.create_task(client_to_server()),
                asyncio.create_task(server_to_client()),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                # A pump's socket error is only the end of this connection.
                await asyncio.gather(*pumps, return_exceptions=True)
        except OSError:
            pass  # the server went away: so does this connection
        finally:
            for side in sides:
                side.close()
                self._open.discard(side)
            self._pumps.discard(task)
