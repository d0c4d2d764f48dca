"""Storing accepted webhooks on SQLite, many per statement, on the writer thread.

What becomes of each event is decided as on every backend
(relay.store.accept); here is SQLite's writing of it. One query finds which
idempotency keys the database already holds, then one statement writes the
new events and one their deliveries. Row ids are given here (the transaction
holds the write lock, so nobody else can take them), which is what lets
deliveries be written in bulk beside their events.
"""

from __future__ import annotations

import functools
import itertools
import sqlite3
from collections.abc import Sequence
from typing import Any

from relay.store.accept import (
    NEW_DELIVERY,
    NEW_EVENT,
    STORED_HOLDER,
    AcceptJob,
    Holder,
    Lines,
    decide,
    delivery_rows,
)
from relay.store.base import Accepted

# SQLite's limit on bound variables is 32766; keep lookups well under it.
_LOOKUP_CHUNK = 500
# Rows per statement, within that limit (events have 14 columns, deliveries 10).
_EVENTS_PER_STATEMENT = 2000
_ROWS_PER_STATEMENT = 256
# An unfinished delivery of this ordering key (target, key) is stored.
_LINE_BUSY = (
    "SELECT 1 FROM deliveries WHERE target = ? AND order_key = ?"
    " AND status IN ('pending', 'in_flight', 'dead') LIMIT 1"
)


class SqliteAccept(AcceptJob):
    """An AcceptJob as the writer runs it (relay.store.sqlite.writer.Batched):
    a run of them waiting for the same commit is stored by one run_many.

    (No `__call__`: mypyc's compiled subclass of a compiled class that has
    none crashes when called.)"""

    @staticmethod
    def run_many(connection: sqlite3.Connection, jobs: Sequence[AcceptJob]) -> list[Accepted]:
        # Any job's guard, not the first one's: an alert (no guard) may lead
        # a run of senders' webhooks, which must not be acknowledged past it.
        guard = next((job.guard for job in jobs if job.guard is not None), None)
        if guard is not None:
            guard()
        results: list[Accepted] = []
        for start in range(0, len(jobs), _EVENTS_PER_STATEMENT):
            chunk = jobs[start : start + _EVENTS_PER_STATEMENT]
            # Optimistic first: a resent webhook is rare, so insert as if every
            # key were new and let the UNIQUE index say otherwise; only then
            # look the keys up. The chunk's events are one INSERT, and SQLite
            # backs out a failed statement, not the transaction: no savepoint
            # (each statement of a batch hands the GIL over twice).
            try:
                results += _insert(connection, chunk, {})
            except sqlite3.IntegrityError:
                results += _insert(connection, chunk, _stored_keys(connection, chunk))
        return results


def _insert(
    connection: sqlite3.Connection,
    jobs: Sequence[AcceptJob],
    stored: dict[tuple[str, str], list[Holder]],
) -> list[Accepted]:
    next_event, next_delivery = _next_ids(connection)
    results, stores = decide(jobs, stored, itertools.count(next_event).__next__)

    def line_busy(target: str, key: str) -> bool:
        return connection.execute(_LINE_BUSY, (target, key)).fetchone() is not None

    deliveries = delivery_rows(stores, Lines(line_busy), itertools.count(next_delivery).__next__)
    if stores:  # all of the events in one statement (see run_many)
        event_rows = [new.event_row() for new in stores]
        connection.execute(
            _statement(NEW_EVENT.insert, len(NEW_EVENT), len(event_rows)), _flatten(event_rows)
        )
    _insert_rows(connection, NEW_DELIVERY.insert, len(NEW_DELIVERY), deliveries)
    return results


def _insert_rows(
    connection: sqlite3.Connection, head: str, columns: int, rows: list[tuple[Any, ...]]
) -> None:
    """Many rows in one statement (one step), not one step per row as
    `executemany` does: each step releases and takes back the GIL, and on a
    busy core every such handover is a thread switch."""
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        connection.execute(_statement(head, columns, len(chunk)), _flatten(chunk))


# Every batch size seen keeps its statement text here, and its prepared
# statement in the writer connection's cache (STATEMENTS_CACHED): preparing a
# many-row INSERT costs about as much as storing its events.
@functools.lru_cache(maxsize=512)
def _statement(head: str, columns: int, count: int) -> str:
    row = "(" + ",".join("?" * columns) + ")"
    return head + ",".join([row] * count)


def _flatten(rows: list[tuple[Any, ...]]) -> list[Any]:
    return [value for row in rows for value in row]


# MAX of the rowid is one step down a table's B-tree; the high-water mark
# covers ids whose rows a purge has deleted (they are never given again).
_NEXT_IDS = "SELECT " + ", ".join(
    f"max(coalesce((SELECT MAX(id) FROM {table}), 0),"
    f" coalesce((SELECT last_id FROM id_high_water WHERE name = '{table}'), 0)) + 1"
    for table in ("events", "deliveries")
)


def _next_ids(connection: sqlite3.Connection) -> tuple[int, int]:
    """The next event id and the next delivery id, in one statement."""
    events, deliveries = connection.execute(_NEXT_IDS).fetchone()
    return int(events), int(deliveries)


def _stored_keys(
    connection: sqlite3.Connection, jobs: Sequence[AcceptJob]
) -> dict[tuple[str, str], list[Holder]]:
    """Every stored event holding one of these keys, by (route, key), first holder first."""
    keys = sorted({job.event.idempotency_key for job in jobs if job.event.idempotency_key})
    found: dict[tuple[str, str], list[Holder]] = {}
    for start in range(0, len(keys), _LOOKUP_CHUNK):
        chunk = keys[start : start + _LOOKUP_CHUNK]
        marks = ",".join("?" * len(chunk))
        rows = connection.execute(
            f"SELECT {STORED_HOLDER.columns} FROM events"
            f" WHERE idempotency_key IN ({marks}) ORDER BY key_variant",
            chunk,
        )
        for line, holder in map(STORED_HOLDER.from_row, rows):
            found.setdefault(line, []).append(holder)
    return found
