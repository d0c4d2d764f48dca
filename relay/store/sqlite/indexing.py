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
            connection.execute(PROGRESS, (through, through))

        # Made again from the events if a power cut undoes it: no fsync of its own.
        await self._write(job, durable=False)

    async def indexing_begins(self, through: int | None) -> None:
        def job(connection: sqlite3.Connection) -> None:
            connection.execute(
                "UPDATE search_progress SET working_through = ? WHERE id = 1", (through,)
            )

        # In the file before the indexer reads: a crash of the process keeps
        # it (the OS has it); a power cut that loses it loses no event.
        await self._write(job, durable=False)

    async def skip_indexing(self, event_id: int, reason: str) -> None:
        def job(connection: sqlite3.Connection) -> None:
            connection.execute("UPDATE events SET flagged = ? WHERE id = ?", (reason, event_id))
            connection.execute(PROGRESS, (event_id, event_id))

        await self._write(job)


# The index reaches `through`: the indexer is on none once it reaches what it began.
PROGRESS = (
    "UPDATE search_progress SET indexed_through = max(indexed_through, ?),"
    " working_through = CASE WHEN working_through <= ? THEN NULL ELSE working_through END"
    " WHERE id = 1"
)
