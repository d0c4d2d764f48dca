"""Storing accepted webhooks, many per statement.

Every request waiting for the same group commit is stored by one pass: one
query finds which idempotency keys the database already holds, then one
`executemany` writes the new events and one their deliveries. Row ids are
given here (the transaction holds the write lock, so nobody else can take
them), which is what lets deliveries be written in bulk beside their events.
The UNIQUE index on (key, route) stays the last line against duplicates.
"""

from __future__ import annotations

import functools
import itertools
import secrets
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson

from relay.core.canonical import payload_digest
from relay.store.base import Accepted, NewDelivery, NewEvent, Status

# SQLite's limit on bound variables is 32766; keep lookups well under it.
_LOOKUP_CHUNK = 500


# The classes made for every webhook here are plain, not dataclasses: mypyc
# compiles their __init__, and not one that a dataclass generates.


class Holder:
    """A stored event (or one earlier in this batch) that holds a key."""

    def __init__(
        self,
        event_id: int,
        variant: int,
        digest: bytes | None,
        # Only for rows stored before digests were kept: the digest is worked
        # out from them once, when a key they hold comes again.
        body: bytes = b"",
        content_type: str | None = None,
    ) -> None:
        self.event_id = event_id
        self.variant = variant
        self._digest = digest
        self._body = body
        self._content_type = content_type

    @property
    def digest(self) -> bytes:
        if self._digest is None:
            self._digest = payload_digest(self._body, self._content_type)
        return self._digest


class AcceptJob:
    """An event to store with its deliveries."""

    def __init__(
        self,
        event: NewEvent,
        deliveries: Sequence[NewDelivery],
        now: float,
        refuse_conflict: bool = False,
        guard: Callable[[], None] | None = None,
    ) -> None:
        self.event = event
        self.deliveries = deliveries
        self.now = now
        self.refuse_conflict = refuse_conflict
        # Raises StoreUnavailable when the events must not be acknowledged (the
        # database file was deleted or replaced): asked once per batch, in the
        # transaction, rather than once per request.
        self.guard = guard

    def __call__(self, connection: sqlite3.Connection) -> Accepted:
        return self.run_many(connection, [self])[0]

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
                results += AcceptJob._insert(connection, chunk, {})
            except sqlite3.IntegrityError:
                results += AcceptJob._insert(connection, chunk, _stored_keys(connection, chunk))
        return results

    @staticmethod
    def _insert(
        connection: sqlite3.Connection,
        jobs: Sequence[AcceptJob],
        stored: dict[tuple[str, str], list[Holder]],
    ) -> list[Accepted]:
        next_event, next_delivery = _next_ids(connection)
        results, stores = decide(jobs, stored, itertools.count(next_event).__next__)
        event_rows = []
        delivery_rows = []
        lines = _Lines(connection)
        tags = message_tags(stores)
        for new in stores:
            event_rows.append(new.event_row())
            for delivery in new.job.deliveries:
                pending = delivery.status is Status.PENDING
                key = delivery.order_key if pending else None
                # Behind an unfinished delivery of its key, it waits its turn.
                due = new.job.now if pending and not lines.queued(delivery.target, key) else None
                delivery_rows.append(
                    (
                        next_delivery,
                        new.event_id,
                        new.job.event.route,
                        delivery.target,
                        delivery.status.value,
                        due,
                        delivery.reason,
                        new.job.now,
                        key,
                        next(tags),
                    )
                )
                next_delivery += 1
        if event_rows:  # all of them in one statement (see run_many)
            connection.execute(
                _statement(_EVENTS, len(event_rows[0]), len(event_rows)), _flatten(event_rows)
            )
        _insert_rows(connection, _DELIVERIES, delivery_rows)
        return results


class ToStore:
    """An event the batch stores: its id, and its key's variant and first holder."""

    def __init__(
        self, job: AcceptJob, event_id: int, variant: int, conflict_of: int | None
    ) -> None:
        self.job = job
        self.event_id = event_id
        self.variant = variant
        self.conflict_of = conflict_of

    def event_row(self) -> tuple[Any, ...]:
        event = self.job.event
        return (
            self.event_id,
            event.route,
            event.idempotency_key,
            event.received_at,
            event.remote_addr,
            event.payload.method,
            event.payload.path,
            event.payload.query,
            orjson.dumps(event.payload.headers),
            event.payload.content_type,
            event.payload.body,
            event.digest,
            self.variant,
            self.conflict_of,
        )


def decide(
    jobs: Sequence[AcceptJob],
    stored: dict[tuple[str, str], list[Holder]],
    new_id: Callable[[], int],
) -> tuple[list[Accepted], list[ToStore]]:
    """What becomes of each job of a batch, given the stored holders of its keys
    (`stored`, by (route, key), first holder first): a duplicate, a refused
    conflict, or an event to store (with an id from `new_id`). Both backends
    decide here, so a key means the same on either."""
    results: list[Accepted] = []
    stores: list[ToStore] = []
    for job in jobs:
        event = job.event
        variant = 0
        conflict_of = None
        holders = None
        if event.idempotency_key is not None:
            holders = stored.setdefault((event.route, event.idempotency_key), [])
        if holders:
            digest = _digest_of(event)
            same = next((h for h in holders if h.digest == digest), None)
            if same is not None:
                results.append(Accepted(same.event_id, duplicate=True))
                continue
            first = holders[0].event_id
            if job.refuse_conflict:
                results.append(Accepted(first, duplicate=False, conflict_of=first, refused=True))
                continue
            # Same key, other content: a different notification. Stored as
            # the key's next variant, never answered "duplicate".
            variant = max(h.variant for h in holders) + 1
            conflict_of = first
        event_id = new_id()
        if holders is not None:
            # A second copy in this same batch compares against this one.
            holders.append(
                Holder(
                    event_id, variant, event.digest, event.payload.body, event.payload.content_type
                )
            )
        stores.append(ToStore(job, event_id, variant, conflict_of))
        results.append(Accepted(event_id, duplicate=False, conflict_of=conflict_of))
    return results, stores


def message_tags(stores: Sequence[ToStore]) -> Iterator[str]:
    """The random tags of the new deliveries of `stores`, in order. Each is
    stored with its delivery: its webhook-id is msg_relay_<id>_<tag>, the same
    on every attempt, and no other database (a reinstall, a restored backup, a
    second relay) makes it again for another message, as a receiver that
    remembers ids would drop that message. One read of the system's random
    source for the whole batch, not a system call per delivery."""
    count = sum(len(new.job.deliveries) for new in stores)
    random = secrets.token_hex(_TAG_BYTES * count)
    size = 2 * _TAG_BYTES
    return (random[start : start + size] for start in range(0, size * count, size))


_TAG_BYTES = 8


def _digest_of(event: NewEvent) -> bytes:
    if event.digest is not None:
        return event.digest
    return payload_digest(event.payload.body, event.payload.content_type)


_EVENTS = (
    "INSERT INTO events (id, route, idempotency_key, received_at, remote_addr, method,"
    " path, query, headers, content_type, body, digest, key_variant, conflict_of) VALUES "
)
_DELIVERIES = (
    "INSERT INTO deliveries (id, event_id, route, target, status, next_attempt_at,"
    " last_error, updated_at, order_key, message_tag) VALUES "
)


class _Lines:
    """Which ordering keys already have an unfinished delivery (in the database,
    or earlier in this batch): a new delivery with such a key joins the line."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self._busy: set[tuple[str, str]] = set()

    def queued(self, target: str, key: str | None) -> bool:
        if key is None:
            return False
        line = (target, key)
        if line in self._busy:
            return True
        self._busy.add(line)
        row = self._connection.execute(
            "SELECT 1 FROM deliveries WHERE target = ? AND order_key = ?"
            " AND status IN ('pending', 'in_flight', 'dead') LIMIT 1",
            line,
        ).fetchone()
        return row is not None


# Rows per statement: SQLite binds at most 32766 values (events have 14
# columns, deliveries 10).
_EVENTS_PER_STATEMENT = 2000
_ROWS_PER_STATEMENT = 256


def _insert_rows(connection: sqlite3.Connection, head: str, rows: list[tuple[Any, ...]]) -> None:
    """Many rows in one statement (one step), not one step per row as
    `executemany` does: each step releases and takes back the GIL, and on a
    busy core every such handover is a thread switch."""
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        connection.execute(_statement(head, len(chunk[0]), len(chunk)), _flatten(chunk))


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
        # The body is read only for rows older than digests (digest IS NULL).
        for key, route, event_id, variant, digest, body, content_type in connection.execute(
            "SELECT idempotency_key, route, id, key_variant, digest,"
            " CASE WHEN digest IS NULL THEN body END, content_type"
            f" FROM events WHERE idempotency_key IN ({marks}) ORDER BY key_variant",
            chunk,
        ):
            holder = Holder(event_id, variant, digest, bytes(body or b""), content_type)
            found.setdefault((route, key), []).append(holder)
    return found
