"""The PostgreSQL store's maintenance: retention; the server keeps space and memory itself."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from relay.store.base import StoreError
from relay.store.dialect import POSTGRES, numbered
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection
from relay.store.reads import purgeable


class PostgresMaintenance(PostgresConnection):
    async def purge(
        self, cutoffs: Mapping[str, float], default_cutoff: float, *, limit: int, dry_run: bool
    ) -> int:
        if dry_run:
            return await self._purgeable(cutoffs, default_cutoff)
        where, params = purgeable(POSTGRES, cutoffs, default_cutoff)

        async def job(connection: Connection) -> int:
            event_ids = [
                event_id
                for (event_id,) in await connection.fetch(
                    numbered(
                        f"SELECT id FROM events WHERE {where}"
                        " ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED"
                    ),
                    *params,
                    limit,
                )
            ]
            if not event_ids:
                return 0
            delivery_ids = [
                delivery_id
                for (delivery_id,) in await connection.fetch(
                    "SELECT id FROM deliveries WHERE event_id = ANY($1::bigint[])", event_ids
                )
            ]
            for table, column, ids in (
                ("attempts", "delivery_id", delivery_ids),
                ("delivery_log", "delivery_id", delivery_ids),
                ("deliveries", "id", delivery_ids),
                ("event_search", "event_id", event_ids),
                ("events", "id", event_ids),
            ):
                await connection.execute(
                    f"DELETE FROM {table} WHERE {column} = ANY($1::bigint[])", ids
                )
            return len(event_ids)

        return await self._write(job)

    async def backup(self, destination: Path) -> int:
        raise StoreError(
            "relay backup copies a SQLite file; on PostgreSQL use pg_dump"
            f" (pg_dump --format=custom --file={destination} DATABASE), see docs/postgres.md"
        )

    async def reclaim_space(self) -> int:
        return 0  # autovacuum gives freed space back to the table

    async def release_memory(self) -> None:
        pass  # the server holds the caches; the pool's connections keep little
