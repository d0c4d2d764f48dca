"""The PostgreSQL store's content index (pg_trgm), filled in the background."""

from __future__ import annotations

from collections.abc import Sequence

from relay.store.base import SearchDocument
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection


class PostgresIndexing(PostgresConnection):
    async def index_events(self, documents: Sequence[SearchDocument], through: int) -> None:
        async def job(connection: Connection) -> None:
            if documents:
                await connection.execute(
                    "INSERT INTO event_search (event_id, text, digits)"
                    " SELECT d.id, d.text, d.digits"
                    " FROM unnest($1::bigint[], $2::text[], $3::text[]) AS d(id, text, digits)"
                    " WHERE EXISTS (SELECT 1 FROM events WHERE events.id = d.id)"
                    " ON CONFLICT (event_id) DO UPDATE SET text = excluded.text,"
                    " digits = excluded.digits",
                    [doc.event_id for doc in documents],
                    [_text(doc.text) for doc in documents],
                    [_text(doc.digits) for doc in documents],
                )
            await connection.execute(PROGRESS, through)

        await self._write(job)

    async def indexing_begins(self, through: int | None) -> None:
        async def job(connection: Connection) -> None:
            await connection.execute(
                "UPDATE search_progress SET working_through = $1 WHERE id = 1", through
            )

        await self._write(job)

    async def skip_indexing(self, event_id: int, reason: str) -> None:
        async def job(connection: Connection) -> None:
            await connection.execute(
                "UPDATE events SET flagged = $1 WHERE id = $2", reason, event_id
            )
            await connection.execute(PROGRESS, event_id)

        await self._write(job)


# As SQLite's (relay.store.sqlite.indexing.PROGRESS).
PROGRESS = (
    "UPDATE search_progress SET indexed_through = GREATEST(indexed_through, $1),"
    " working_through = CASE WHEN working_through <= $1 THEN NULL ELSE working_through END"
    " WHERE id = 1"
)


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; the search text never needs one.
    return value.replace("\x00", " ")
