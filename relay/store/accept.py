"""Accepting webhooks, many per statement: what both backends decide and write.

Every request waiting for the same group commit is stored by one pass. The
stored holders of the batch's idempotency keys are looked up (STORED_HOLDER),
`decide` says what becomes of each event (a duplicate, a refused conflict,
an event to store), and the new events' and deliveries' rows (NEW_EVENT,
NEW_DELIVERY) are written in bulk. Each backend runs the statements its way:
relay.store.sqlite.accept on the writer thread, relay.store.postgres.accept
from arrays. The UNIQUE index on (key, route) stays the last line against
duplicates.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson

from relay.core.canonical import payload_digest
from relay.store.base import Accepted, NewDelivery, NewEvent, Status
from relay.store.columns import blob
from relay.store.shape import Column, Shape, Written

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


def _holding(route: str, key: str, holder: Holder) -> tuple[tuple[str, str], Holder]:
    return (route, key), holder


# A stored event holding a key: ((route, key), its Holder). The body is read
# only for rows older than digests (digest IS NULL).
STORED_HOLDER = Shape(
    _holding,
    route="route",
    key="idempotency_key",
    holder=Shape(
        Holder,
        event_id="id",
        variant="key_variant",
        digest="digest",
        body=Column("CASE WHEN digest IS NULL THEN body END", blob),
        content_type="content_type",
    ),
)


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


# A new event's row, made by ToStore.event_row.
NEW_EVENT = Written(
    "events",
    id="bigint",
    route="text",
    idempotency_key="text",
    received_at="float8",
    remote_addr="text",
    method="text",
    path="text",
    query="text",
    headers="bytea",
    content_type="text",
    body="bytea",
    digest="bytea",
    key_variant="int",
    conflict_of="bigint",
)


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
        """Its row: NEW_EVENT's columns, in order."""
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
    stored with its delivery: its identity is msg_relay_<id>_<tag>, the same
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


# A new delivery's row, made by delivery_rows.
NEW_DELIVERY = Written(
    "deliveries",
    id="bigint",
    event_id="bigint",
    route="text",
    target="text",
    status="text",
    next_attempt_at="float8",
    last_error="text",
    updated_at="float8",
    order_key="text",
    message_tag="text",
    event_keyed="boolean",
)


class Lines:
    """Which ordering keys already have an unfinished delivery (in the
    database, as `stored` says, or earlier in this batch): a new delivery
    with such a key joins the line, waiting its turn."""

    def __init__(self, stored: Callable[[str, str], bool]) -> None:
        self._stored = stored
        self._busy: set[tuple[str, str]] = set()

    def queued(self, target: str, key: str | None) -> bool:
        if key is None:
            return False
        line = (target, key)
        if line in self._busy:
            return True
        self._busy.add(line)
        return self._stored(target, key)


def delivery_rows(
    stores: Sequence[ToStore], lines: Lines, new_id: Callable[[], int | None]
) -> list[tuple[Any, ...]]:
    """The rows of the new deliveries of `stores` (NEW_DELIVERY's columns, the
    id from `new_id`), in order: a pending one is due now, unless it joins the
    line of its ordering key (`lines`), where it waits its turn."""
    rows = []
    tags = message_tags(stores)
    for new in stores:
        job = new.job
        for delivery in job.deliveries:
            pending = delivery.status is Status.PENDING
            key = delivery.order_key if pending else None
            due = job.now if pending and not lines.queued(delivery.target, key) else None
            rows.append(
                (
                    new_id(),
                    new.event_id,
                    job.event.route,
                    delivery.target,
                    delivery.status.value,
                    due,
                    delivery.reason,
                    job.now,
                    key,
                    next(tags),
                    False,  # its identity is its own (relay.core.identity)
                )
            )
    return rows
