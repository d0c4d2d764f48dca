"""The SQLite store's streaks: a route's failed attempts in a row at a target."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store.base import RouteRun, RouteStreak
from relay.store.sqlite.connection import SqliteConnection
from relay.store.streaks import COLUMNS, FAILING, WRITE, counted, nothing_to_count, streaks_of


class SqliteStreaks(SqliteConnection):
    async def count_runs(self, runs: Sequence[RouteRun], now: float) -> list[tuple[int, int]]:
        if not runs:
            return []
        if nothing_to_count(await self.route_streaks(), runs):
            return [(0, 0)] * len(runs)

        def job(connection: sqlite3.Connection) -> list[tuple[int, int]]:
            # The whole table: a row per route and target.
            rows = connection.execute(f"SELECT {COLUMNS} FROM route_streaks").fetchall()
            answers, changed = counted(streaks_of(rows), runs)
            connection.executemany(
                WRITE,
                [(*key, streak.failures, streak.error, now) for key, streak in changed.items()],
            )
            return answers

        return await self._write(job)

    async def route_streaks(self) -> dict[tuple[str, str], RouteStreak]:
        return streaks_of(await self._read(FAILING))
