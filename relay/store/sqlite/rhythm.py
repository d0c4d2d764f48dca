"""The SQLite store's Rhythms: what the silence watch keeps (relay.store.rhythm)."""

from __future__ import annotations

import sqlite3

from relay.store.base import Learned, RouteWatch
from relay.store.columns import ROUTE_WATCH
from relay.store.dialect import SQLITE
from relay.store.rhythm import (
    LEARNT,
    LONGEST,
    MARK_SILENT,
    NOT_SILENT,
    PRUNE,
    SEEN,
    SILENT,
)
from relay.store.sqlite.connection import SqliteConnection

_SEEN = SEEN.format(least=SQLITE.least, greatest=SQLITE.greatest)
_LONGEST = LONGEST.format(greatest=SQLITE.greatest)


class SqliteRhythms(SqliteConnection):
    async def learn_rhythm(self, learned: Learned) -> dict[str, RouteWatch]:
        def job(connection: sqlite3.Connection) -> dict[str, RouteWatch]:
            back = {}
            for route in learned.back:
                row = connection.execute(SILENT, (route,)).fetchone()
                if row is not None:
                    back[route] = ROUTE_WATCH.from_row(row)
                    connection.execute(NOT_SILENT, (route,))
            connection.executemany(
                _SEEN, [(route, *times) for route, times in learned.seen.items()]
            )
            connection.executemany(
                _LONGEST,
                [
                    (slot, route, week, seconds)
                    for (route, week, slot), seconds in learned.longest.items()
                ],
            )
            connection.execute(PRUNE, (learned.keep_from_week,))
            connection.execute(LEARNT, (learned.through, learned.through))
            return back

        result: dict[str, RouteWatch] = await self._write(job)
        return result

    async def mark_silent(self, route: str, at: float, usual: float | None, limit: float) -> bool:
        def job(connection: sqlite3.Connection) -> bool:
            return connection.execute(MARK_SILENT, (at, usual, limit, route)).rowcount == 1

        result: bool = await self._write(job)
        return result
