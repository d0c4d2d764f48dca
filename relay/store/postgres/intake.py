"""The PostgreSQL store's intake: webhooks (group-committed, relay.store.postgres.accept)
and refused requests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

import relay.store.rows as rows
from relay.store.accept import AcceptJob
from relay.store.base import (
    REJECTIONS_KEPT,
    Accepted,
    NewDelivery,
    NewEvent,
    Rejection,
    StoreUnavailable,
)
from relay.store.dialect import numbered
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection

# A refused request is kept as on SQLite.
INSERT_REJECTION = numbered(rows.INSERT_REJECTION)
PRUNE_REJECTIONS = numbered(rows.PRUNE_REJECTIONS)


class PostgresIntake(PostgresConnection):
    def accept_event(
        self,
        event: NewEvent,
        deliveries: Sequence[NewDelivery],
        now: float,
        *,
        refuse_conflict: bool = False,
        from_sender: bool = True,
    ) -> asyncio.Future[Accepted]:
        # (No file to lose: file_problem() is always None here.)
        if self._intake is None:
            raise StoreUnavailable("store is not open")
        return self._intake.submit(AcceptJob(event, deliveries, now, refuse_conflict))

    async def record_rejection(self, rejection: Rejection) -> None:
        async def job(connection: Connection) -> None:
            await connection.execute(
                INSERT_REJECTION,
                rejection.route,
                rejection.at,
                rejection.remote_addr,
                rejection.reason,
                rejection.detail,
                orjson.dumps(rejection.headers),
            )
            await connection.execute(
                PRUNE_REJECTIONS, rejection.route, rejection.route, REJECTIONS_KEPT
            )

        await self._write(job)
