"""Group commit on PostgreSQL: concurrent accepts share one transaction.

Requests hand in their event; one task takes every event waiting, writes them
in one transaction (multi-row inserts from arrays), commits, and only then
answers each request with what became of its own event. The answer comes
from the very transaction that held its row: if that commit fails, or its
outcome is unknown because the connection broke, every request in it gets
StoreUnavailable (503 + Retry-After), never "stored".

Keys are decided as on SQLite (relay.store.accept.decide). Several instances
may accept the same key at once: the transaction first takes a transaction-
scoped advisory lock per (route, key), in one order, so the second instance
sees the first one's committed row and answers "duplicate" or stores the
next variant. The UNIQUE index stays the last line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from relay.store.accept import AcceptJob, Holder, ToStore, decide, message_tag
from relay.store.base import Accepted, Status, StoreUnavailable
from relay.store.pg_errors import Connection, is_environmental, unavailable

log = logging.getLogger("relay.store")

EVENT_INSERT = """
INSERT INTO events (id, route, idempotency_key, received_at, remote_addr, method, path,
    query, headers, content_type, body, digest, key_variant, conflict_of)
SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::float8[], $5::text[],
    $6::text[], $7::text[], $8::text[], $9::bytea[], $10::text[], $11::bytea[],
    $12::bytea[], $13::int[], $14::bigint[])
"""
DELIVERY_INSERT = """
INSERT INTO deliveries (event_id, route, target, status, next_attempt_at, last_error,
    updated_at, order_key, message_tag)
SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::float8[],
    $6::text[], $7::float8[], $8::text[], $9::text[])
"""
# Ordering keys (order_by) that already have an unfinished delivery: a new one joins the line.
BUSY_LINES = """
SELECT DISTINCT target, order_key FROM deliveries
WHERE (target, order_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
AND status IN ('pending', 'in_flight', 'dead')
"""
# Lock each key of the batch, in one order: two batches never wait on each other in a cycle.
LOCK_KEYS = """
SELECT pg_advisory_xact_lock(h) FROM (
    SELECT DISTINCT hashtextextended(r || '/' || k, 0) AS h
    FROM unnest($1::text[], $2::text[]) AS t(r, k) ORDER BY h) AS locks
"""
STORED_HOLDERS = """
SELECT idempotency_key, route, id, key_variant, digest,
    CASE WHEN digest IS NULL THEN body END, content_type
FROM events
WHERE (idempotency_key, route) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY key_variant
"""
NEW_IDS = "SELECT nextval(pg_get_serial_sequence('events', 'id')) FROM generate_series(1, $1)"


@dataclass(eq=False)
class _Waiting:
    job: AcceptJob
    future: asyncio.Future[Accepted]
    deadline: float
    taken: bool = field(default=False)


class PgIntake:
    """One batching task per process; `accept` awaits the commit that held the event."""

    def __init__(
        self, pool: asyncpg.Pool, *, queue_timeout: float, max_batch: int = 500, notify: str = ""
    ) -> None:
        self._pool = pool
        self._queue_timeout = queue_timeout
        self._max_batch = max_batch
        self._notify = notify
        self._queue: list[_Waiting] = []
        self._has_work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0
        self.jobs = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="relay-pg-intake")

    async def close(self) -> None:
        self._closing = True
        self._has_work.set()
        if self._task is not None:
            await self._task

    def submit(self, job: AcceptJob) -> asyncio.Future[Accepted]:
        """Queue `job` for the next group transaction; the future has its outcome."""
        if self._closing or self._task is None:
            raise StoreUnavailable("store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Accepted] = loop.create_future()
        self._queue.append(_Waiting(job, future, loop.time() + self._queue_timeout))
        self._has_work.set()
        return future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._has_work.wait()
            self._has_work.clear()
            now = loop.time()
            batch: list[_Waiting] = []
            for waiting in self._queue[: self._max_batch]:
                if waiting.future.done():
                    continue
                if now >= waiting.deadline:
                    waiting.future.set_exception(
                        StoreUnavailable("no write slot in time: the database is slow or away")
                    )
                    continue
                batch.append(waiting)
            del self._queue[: self._max_batch]
            if self._queue:
                self._has_work.set()
            if not batch:
                if self._closing and not self._queue:
                    return
                continue
            for waiting in batch:
                waiting.taken = True
            results = await self._commit([w.job for w in batch])
            self.batches += 1
            self.jobs += len(batch)
            for waiting, result in zip(batch, results, strict=True):
                if waiting.future.done():
                    continue
                if isinstance(result, BaseException):
                    waiting.future.set_exception(result)
                else:
                    waiting.future.set_result(result)

    async def _commit(self, jobs: list[AcceptJob]) -> list[Accepted | BaseException]:
        try:
            return list(await self._transaction(jobs))
        except Exception as error:
            if len(jobs) == 1 or is_environmental(error):
                failure = unavailable(error)
                if not isinstance(failure, StoreUnavailable):
                    log.error("storing a batch of %d events failed: %s", len(jobs), error)
                return [failure] * len(jobs)
        # One event broke the batch: each alone, so the others still land.
        results: list[Accepted | BaseException] = []
        for job in jobs:
            try:
                results.extend(await self._transaction([job]))
            except Exception as error:
                results.append(unavailable(error))
        return results

    async def _transaction(self, jobs: Sequence[AcceptJob]) -> list[Accepted]:
        async with self._pool.acquire() as connection:
            try:
                async with connection.transaction():
                    results = await store_batch(connection, jobs)
                    if self._notify:
                        # Delivered with the commit, to every instance listening.
                        await connection.execute("SELECT pg_notify($1, 'event')", self._notify)
                    return results
            except asyncpg.exceptions.InternalClientError:
                connection.terminate()  # its protocol state is unknown: not to be lent again
                raise


async def store_batch(connection: Connection, jobs: Sequence[AcceptJob]) -> list[Accepted]:
    """Store a batch in the caller's transaction; what became of each job, in order."""
    keyed = sorted(
        {(j.event.route, j.event.idempotency_key) for j in jobs if j.event.idempotency_key}
    )
    stored: dict[tuple[str, str], list[Holder]] = {}
    if keyed:
        routes = [route for route, _ in keyed]
        keys = [key for _, key in keyed]
        await connection.execute(LOCK_KEYS, routes, keys)
        for key, route, event_id, variant, digest, body, content_type in await connection.fetch(
            STORED_HOLDERS, keys, routes
        ):
            holder = Holder(event_id, variant, digest, bytes(body or b""), content_type)
            stored.setdefault((route, key), []).append(holder)
    # Ids for every job (a duplicate's id is never used: a gap, as sequences have).
    ids = [row[0] for row in await connection.fetch(NEW_IDS, len(jobs))]
    results, stores = decide(jobs, stored, iter(ids).__next__)
    if stores:
        await _insert(connection, stores)
    return results


async def _insert(connection: Connection, stores: list[ToStore]) -> None:
    columns: list[list[Any]] = [
        list(values) for values in zip(*(s.event_row() for s in stores), strict=True)
    ]
    await connection.execute(EVENT_INSERT, *columns)
    busy = await _busy_lines(connection, stores)
    rows = []
    for new in stores:
        for delivery in new.job.deliveries:
            pending = delivery.status is Status.PENDING
            key = delivery.order_key if pending else None
            due: float | None = new.job.now if pending else None
            if key is not None:
                # Behind an unfinished delivery of its key, it waits its turn.
                if (delivery.target, key) in busy:
                    due = None
                busy.add((delivery.target, key))
            row = (new.event_id, new.job.event.route, delivery.target, delivery.status.value)
            rows.append((*row, due, delivery.reason, new.job.now, key, message_tag()))
    if rows:
        await connection.execute(DELIVERY_INSERT, *(list(c) for c in zip(*rows, strict=True)))


async def _busy_lines(connection: Connection, stores: list[ToStore]) -> set[tuple[str, str]]:
    """The ordering lines this batch joins that already have an unfinished delivery.

    Each line is locked first (as keys are): two instances adding to one line
    at once must not both find it empty and both send at once.
    """
    lines = sorted(
        {
            (d.target, d.order_key)
            for new in stores
            for d in new.job.deliveries
            if d.order_key is not None and d.status is Status.PENDING
        }
    )
    if not lines:
        return set()
    targets = ["line:" + target for target, _ in lines]
    keys = [key for _, key in lines]
    await connection.execute(LOCK_KEYS, targets, keys)
    found = await connection.fetch(BUSY_LINES, [t for t, _ in lines], keys)
    return {(row[0], row[1]) for row in found}
