"""The PostgreSQL store's intake: webhooks (group-committed, relay.store.postgres.accept)
and refused requests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from relay.store.accept import AcceptJob
from relay.store.base import (
    REJECTIONS_KEPT,
    Accepted,
    NewDelivery,
    NewEvent,
    Rejection,
    StoreUnavailable,
)
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection


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
                "INSERT INTO rejections (route, at, remote_addr, reason, detail, headers)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                rejection.route,
                rejection.at,
                rejection.remote_addr,
                rejection.reason,
                rejection.detail,
                orjson.dumps(rejection.headers),
            )
            await connection.execute(
                "DELETE FROM rejections WHERE route = $1 AND id <= (SELECT id FROM rejections"
                " WHERE route = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)",
                rejection.route,
                REJECTIONS_KEPT,
            )

        await self._write(job)
