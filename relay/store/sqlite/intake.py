"""The SQLite store's intake: webhooks and refused requests, written down."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence

import orjson

from relay.store.base import (
    REJECTIONS_KEPT,
    Accepted,
    NewDelivery,
    NewEvent,
    Rejection,
    StoreUnavailable,
)
from relay.store.rows import INSERT_REJECTION, PRUNE_REJECTIONS
from relay.store.sqlite.accept import SqliteAccept
from relay.store.sqlite.connection import SqliteConnection


class SqliteIntake(SqliteConnection):
    def accept_event(
        self,
        event: NewEvent,
        deliveries: Sequence[NewDelivery],
        now: float,
        *,
        refuse_conflict: bool = False,
        from_sender: bool = True,
    ) -> asyncio.Future[Accepted]:
        guard = self._still_the_file if from_sender else None
        job = SqliteAccept(event, deliveries, now, refuse_conflict, guard)
        return self._writer.submit(job, queue_timeout=self._write_queue_timeout, sender=from_sender)

    def _still_the_file(self) -> None:
        """On the writer thread, before a batch of events is stored: refuse to
        acknowledge into a file that is no longer the database's path."""
        problem = self.file_problem()
        if problem is not None:
            raise StoreUnavailable(problem)

    async def record_rejection(self, rejection: Rejection) -> None:
        headers = orjson.dumps(rejection.headers)

        def job(connection: sqlite3.Connection) -> None:
            connection.execute(
                INSERT_REJECTION,
                (
                    rejection.route,
                    rejection.at,
                    rejection.remote_addr,
                    rejection.reason,
                    rejection.detail,
                    headers,
                ),
            )
            connection.execute(
                PRUNE_REJECTIONS, (rejection.route, rejection.route, REJECTIONS_KEPT)
            )

        await self._write(job)
