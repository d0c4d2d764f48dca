"""Accepting events on PostgreSQL, a batch per transaction (relay.store.postgres.batch).

Requests hand in their event; a batch of them is written in one transaction
(multi-row inserts from arrays) and each request answered, after the commit,
with what became of its own event: if that commit fails, or its outcome is
unknown because the connection broke, every request in it gets
StoreUnavailable (503 + Retry-After), never "stored".

Keys are decided as on SQLite (relay.store.accept.decide). Several instances
may accept the same key at once: the transaction first takes a transaction-
scoped advisory lock per (route, key), in one order, so the second instance
sees the first one's committed row and answers "duplicate" or stores the
next variant. The UNIQUE index stays the last line.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from relay.store.accept import (
    NEW_DELIVERY,
    NEW_EVENT,
    STORED_HOLDER,
    AcceptJob,
    Holder,
    Lines,
    ToStore,
    decide,
    delivery_rows,
)
from relay.store.base import Accepted, Status
from relay.store.postgres.errors import Connection

# The events, one array a column.
EVENT_INSERT = NEW_EVENT.from_arrays()
# Events and their deliveries in one statement (a delivery's id is the sequence's).
EVENTS_AND_DELIVERIES = (
    f"WITH event AS ({EVENT_INSERT})\n{NEW_DELIVERY.without('id').from_arrays(len(NEW_EVENT) + 1)}"
)
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
STORED_HOLDERS = f"""
SELECT {STORED_HOLDER.columns} FROM events
WHERE (idempotency_key, route) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY key_variant
"""
NEW_IDS = "SELECT nextval(pg_get_serial_sequence('events', 'id')) FROM generate_series(1, $1)"


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
        rows = await connection.fetch(STORED_HOLDERS, keys, routes)
        for line, holder in map(STORED_HOLDER.from_row, rows):
            stored.setdefault(line, []).append(holder)
    # Ids for every job (a duplicate's id is never used: a gap, as sequences have).
    ids = [event_id for (event_id,) in await connection.fetch(NEW_IDS, len(jobs))]
    results, stores = decide(jobs, stored, iter(ids).__next__)
    if stores:
        await _insert(connection, stores)
    return results


async def _insert(connection: Connection, stores: list[ToStore]) -> None:
    events = _arrays([new.event_row() for new in stores])
    busy = await _busy_lines(connection, stores)
    rows = delivery_rows(
        stores, Lines(lambda target, key: (target, key) in busy), itertools.repeat(None).__next__
    )
    if not rows:
        await connection.execute(EVENT_INSERT, *events)
        return
    # Without the ids (the first column): the sequence gives them.
    await connection.execute(EVENTS_AND_DELIVERIES, *events, *_arrays(rows)[1:])


def _arrays(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows as one array a column."""
    return [list(values) for values in zip(*rows, strict=True)]


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
    return {(target, key) for target, key in found}
