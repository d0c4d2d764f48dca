"""The PostgreSQL store's Rhythms: what the silence watch keeps
(relay.store.rhythm), written by the cluster's leading instance."""

from __future__ import annotations

from relay.store.base import Learned, RouteWatch
from relay.store.columns import ROUTE_WATCH
from relay.store.dialect import POSTGRES, numbered
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection
from relay.store.rhythm import (
    LEARNT,
    LONGEST,
    MARK_SILENT,
    NOT_SILENT,
    PRUNE,
    SEEN,
    SILENT,
)

_SEEN = numbered(SEEN.format(least=POSTGRES.least, greatest=POSTGRES.greatest))
_LONGEST = numbered(LONGEST.format(greatest=POSTGRES.greatest))
_SILENT = numbered(SILENT)
_NOT_SILENT = numbered(NOT_SILENT)
_PRUNE = numbered(PRUNE)
_LEARNT = numbered(LEARNT)
_MARK_SILENT = numbered(MARK_SILENT)


class PostgresRhythms(PostgresConnection):
    async def learn_rhythm(self, learned: Learned) -> dict[str, RouteWatch]:
        async def job(connection: Connection) -> dict[str, RouteWatch]:
            back = {}
            for route in learned.back:
                row = await connection.fetchrow(_SILENT, route)
                if row is not None:
                    back[route] = ROUTE_WATCH.from_row(row)
                    await connection.execute(_NOT_SILENT, route)
            await connection.executemany(
                _SEEN, [(route, *times) for route, times in learned.seen.items()]
            )
            await connection.executemany(
                _LONGEST,
                [
                    (slot, route, week, seconds)
                    for (route, week, slot), seconds in learned.longest.items()
                ],
            )
            await connection.execute(_PRUNE, learned.keep_from_week)
            await connection.execute(_LEARNT, learned.through, learned.through)
            return back

        return await self._write(job)

    async def mark_silent(self, route: str, at: float, usual: float | None, limit: float) -> bool:
        async def job(connection: Connection) -> bool:
            done = await connection.execute(_MARK_SILENT, at, usual, limit, route)
            return bool(done == "UPDATE 1")

        return await self._write(job)
