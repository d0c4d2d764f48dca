"""The SQLite store's health: the database still takes a durable write."""

from __future__ import annotations

import sqlite3

from relay.store.base import StoreUnavailable
from relay.store.sqlite.connection import SqliteConnection


class SqliteHealth(SqliteConnection):
    async def heartbeat(self, now: float) -> None:
        problem = self.file_problem()
        if problem is not None:
            raise StoreUnavailable(problem)

        def job(connection: sqlite3.Connection) -> None:
            connection.execute("INSERT OR REPLACE INTO heartbeat (id, at) VALUES (1, ?)", (now,))

        await self._write(job)
