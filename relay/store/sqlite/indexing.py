"""The SQLite store's content index (FTS5), filled in the background."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store.base import SearchDocument
from relay.store.sqlite.connection import SqliteConnection


class SqliteIndexing(SqliteConnection):
    async def index_events(self, documents: Sequence[SearchDocument], through: int) -> None:
        rows = [(doc.event_id, doc.text, doc.digits, doc.event_id) for doc in documents]

        def job(connection: sqlite3.Connection) -> None:
            connection.executemany(
                "INSERT OR REPLACE INTO event_search (rowid, text, digits)"
                " SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM events WHERE id = ?)",
                rows,
            )
            connection.execute(
                "UPDATE search_progress SET indexed_through = max(indexed_through, ?) WHERE id = 1",
                (through,),
            )

        # Made again from the events if a power cut undoes it: no fsync of its own.
        await self._write(job, durable=False)
