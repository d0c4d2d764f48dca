"""SQL text and row mapping shared by the SQLite store's reads and write jobs;
the row mapping (same columns, same order) by the PostgreSQL store too."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

import orjson

from relay.core.outcome import SentRequest, Verdict
from relay.core.payload import Payload
from relay.core.units import format_instant
from relay.store.base import (
    AUDIT_IDS_KEPT,
    AttemptKind,
    AttemptRecord,
    AttemptView,
    AuditEntry,
    ClaimedDelivery,
    Delivered,
    DeliveryView,
    DownState,
    EventDetail,
    EventView,
    FailureStreak,
    Header,
    HeldTargets,
    Hold,
    LogEntry,
    NewEvent,
    Resend,
    ResendLink,
    RetryAt,
    Selection,
    Status,
    TargetState,
    Transition,
    Waits,
)
from relay.store.health import HEALTH_COLUMNS, fails_alone, health_after

EVENT_COLUMNS = (
    "id, route, idempotency_key, received_at, remote_addr, method, path, query, headers,"
    " content_type, body, conflict_of"
)
DELIVERY_COLUMNS = (
    "id, event_id, target, status, attempts, cycle_attempts, next_attempt_at, last_error,"
    " updated_at, order_key, resolves, resolved_by"
)
# Per target, pending deliveries waiting behind a dead one of their ordering key
# (the relay_deliveries_held gauge); read through the ordering lines' index.
HELD_BEHIND_DEAD = """
SELECT p.target, COUNT(*) FROM deliveries p
WHERE p.order_key IS NOT NULL AND p.status = 'pending' AND EXISTS (
    SELECT 1 FROM deliveries d
    WHERE d.target = p.target AND d.order_key = p.order_key
    AND d.status = 'dead' AND d.id < p.id
)
GROUP BY p.target
"""
# The first unfinished delivery of a key: the only one of its line that may go.
HEAD_OF_LINE = """
SELECT id, status, event_id FROM deliveries
WHERE target = ? AND order_key = ? AND status IN ('pending', 'in_flight', 'dead')
ORDER BY id LIMIT 1
"""
# When a delivery leaves its line (delivered, skipped), the next one is due.
NEXT_IN_LINE = """
UPDATE deliveries SET next_attempt_at = ?, updated_at = ?
WHERE id = (
    SELECT n.id FROM deliveries d, deliveries n
    WHERE d.id = ? AND d.order_key IS NOT NULL
    AND n.target = d.target AND n.order_key = d.order_key
    AND n.status IN ('pending', 'in_flight', 'dead')
    ORDER BY n.id LIMIT 1)
AND status = 'pending' AND next_attempt_at IS NULL
"""
CLAIM_RETURNING = (
    "RETURNING id, event_id, route, target, attempts, cycle_attempts, resume_status, resume_at,"
    " message_tag, resolves"
)
CLAIM_DUE = f"""
UPDATE deliveries SET status = 'in_flight', lease_until = ?, updated_at = ?
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'pending' AND target = ? AND next_attempt_at <= ?
    ORDER BY next_attempt_at, id LIMIT ?)
{CLAIM_RETURNING}
"""
# A lease taken over is an attempt interrupted (it may have reached the
# receiver): the next one carries the next number (X-Relay-Attempt), while
# the cycle's count, the retry budget, is not spent by relay's own crash.
CLAIM_EXPIRED = f"""
UPDATE deliveries SET lease_until = ?, updated_at = ?, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'in_flight' AND target = ? AND lease_until <= ? {{exclude}}
    ORDER BY lease_until LIMIT ?)
{CLAIM_RETURNING}
"""

# Deliveries gone dead since a time, and still dead (attention).
DEAD_SINCE = "SELECT COUNT(*) FROM deliveries WHERE status = 'dead' AND updated_at >= ?"
# Ordering keys whose first unfinished delivery is dead, with how many wait.
HELD_KEYS = """
SELECT d.id, d.event_id, d.target, d.order_key,
    (SELECT COUNT(*) FROM deliveries n WHERE n.target = d.target
     AND n.order_key = d.order_key AND n.status = 'pending' AND n.id > d.id)
FROM deliveries d
WHERE d.status = 'dead' AND d.order_key IS NOT NULL
AND d.id = (SELECT h.id FROM deliveries h WHERE h.target = d.target
    AND h.order_key = d.order_key AND h.status IN ('pending', 'in_flight', 'dead')
    ORDER BY h.id LIMIT 1)
AND EXISTS (SELECT 1 FROM deliveries w WHERE w.target = d.target
    AND w.order_key = d.order_key AND w.status = 'pending' AND w.id > d.id)
ORDER BY d.id LIMIT ?
"""

# Paused or down targets, one row each (held_targets).
HELD_TARGETS = (
    "SELECT name, paused, down_since, probe_at, probes, probe_delivery FROM targets"
    " WHERE paused OR down_since IS NOT NULL"
)
# Every target's state (target_states), read by target_state().
TARGET_STATE_COLUMNS = (
    "name, paused, last_success_at, last_error_at, last_error,"
    " consecutive_failures, down_since, probe_at, probes, probe_delivery"
)
# The delivery a down target's next probe takes: the one under way, else
# the first in line (as claim_due orders them).
NEXT_PROBE = (
    "SELECT id FROM deliveries WHERE target = ? AND status IN ('pending', 'in_flight')"
    " AND (status = 'in_flight' OR next_attempt_at IS NOT NULL)"
    " ORDER BY status = 'pending', next_attempt_at, id LIMIT 1"
)


def held_targets(rows: Iterable[Row]) -> HeldTargets:
    return HeldTargets(
        paused=frozenset(row[0] for row in rows if row[1]),
        down={
            row[0]: DownState(row[2], row[3], row[4], last_probe=row[5])
            for row in rows
            if row[2] is not None
        },
    )


def target_state(row: Row, next_probe: int | None = None) -> TargetState:
    """A target's state from a row of TARGET_STATE_COLUMNS."""
    down = None
    if row[6] is not None:
        down = DownState(row[6], row[7], row[8], last_probe=row[9], next_probe=next_probe)
    return TargetState(row[0], bool(row[1]), row[2], row[3], row[4], row[5], down=down)


def select_delivery(connection: sqlite3.Connection, delivery_id: int) -> Sequence[Any]:
    row: Sequence[Any] = connection.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    return row


# A corrected copy delivered: the original's dead delivery to that target is
# resolved, and so on up a chain of copies of copies. A resolved delivery
# leaves its key's line like a delivered one (NEXT_IN_LINE).
RESOLVE = """
UPDATE deliveries SET status = 'resolved', resolved_by = ?, next_attempt_at = NULL,
    resume_status = NULL, resume_at = NULL, updated_at = ?
WHERE id = ? AND status = 'dead'
RETURNING resolves
"""
# Which delivery of the original each delivery of a corrected copy resolves.
LINK_COPY = """
UPDATE deliveries SET resolves = (
    SELECT o.id FROM deliveries o WHERE o.event_id = ? AND o.target = deliveries.target
    ORDER BY o.id LIMIT 1)
WHERE event_id = ?
"""
# How deep a chain of copies of copies is followed (a loop cannot be made,
# a copy being a new event; the bound is only a guard).
RESOLVE_DEPTH = 20


def resolve_originals(
    connection: sqlite3.Connection, delivery: ClaimedDelivery, now: float
) -> None:
    """`delivery`, of a corrected copy, was delivered: resolve what it stands for."""
    original = delivery.resolves
    for _ in range(RESOLVE_DEPTH):
        if original is None:
            return
        row = connection.execute(RESOLVE, (delivery.id, now, original)).fetchone()
        if row is None:  # not dead (delivered meanwhile, skipped, requeued): left as it is
            return
        insert_log(
            connection,
            [original],
            now,
            "resolved",
            f"a corrected copy was delivered: delivery {delivery.id} of event {delivery.event_id}",
        )
        connection.execute(NEXT_IN_LINE, (now, now, original))
        original = row[0]


def insert_log(
    connection: sqlite3.Connection,
    delivery_ids: Iterable[int],
    now: float,
    kind: str,
    detail: str,
    by: str | None = None,
) -> None:
    connection.executemany(
        "INSERT INTO delivery_log (delivery_id, at, kind, detail, by) VALUES (?, ?, ?, ?, ?)",
        [(delivery_id, now, kind, detail, by) for delivery_id in delivery_ids],
    )


INSERT_AUDIT = (
    "INSERT INTO audit (at, by, action, subject, count, deliveries) VALUES (?, ?, ?, ?, ?, ?)"
)
AUDIT_COLUMNS = "id, at, by, action, subject, count, deliveries"


def audit_values(
    now: float, by: str, action: str, subject: str, delivery_ids: Sequence[int]
) -> tuple[object, ...]:
    """An audit row, in the order of INSERT_AUDIT."""
    kept = orjson.dumps(list(delivery_ids[:AUDIT_IDS_KEPT])).decode()
    return (now, by, action, subject, len(delivery_ids), kept)


def insert_audit(
    connection: sqlite3.Connection,
    now: float,
    by: str,
    action: str,
    subject: str,
    delivery_ids: Sequence[int] = (),
) -> None:
    connection.execute(INSERT_AUDIT, audit_values(now, by, action, subject, delivery_ids))


def audit_entry(row: Row) -> AuditEntry:
    """One operator action, from a row of AUDIT_COLUMNS."""
    ids = tuple(int(i) for i in orjson.loads(row[6]))
    return AuditEntry(row[0], row[1], row[2], row[3], row[4], row[5], ids)


def resend_subject(resend: Resend, copy_id: int) -> str:
    """What a resend's audit entry names."""
    return f"event {resend.original_id} as event {copy_id}, to {', '.join(resend.targets)}"


def describe_selection(selection: Selection) -> str:
    """What a bulk action named, in words: "dead, route leads, search 79991234567"."""
    parts = [selection.status.value]
    for name, value in (
        ("route", selection.route),
        ("target", selection.target),
        ("key", selection.key),
    ):
        if value is not None:
            parts.append(f"{name} {value}")
    if selection.since is not None:
        parts.append(f"since {format_instant(selection.since)}")
    if selection.until is not None:
        parts.append(f"until {format_instant(selection.until)}")
    if selection.search is not None:
        found = selection.search
        words = found.digits if found.digits is not None else " ".join(found.words)
        parts.append(f"search {words}")
    if selection.ids:
        shown = " ".join(str(i) for i in selection.ids[:20])
        more = f" and {len(selection.ids) - 20} more" if len(selection.ids) > 20 else ""
        parts.append(f"ids {shown}{more}")
    return ", ".join(parts)


def update_health(
    connection: sqlite3.Connection,
    target: str,
    attempt: AttemptRecord,
    now: float,
    hold: Hold | None,
    delivery_id: int,
) -> FailureStreak:
    """The target's health after this attempt (relay.store.health), written down."""
    row = connection.execute(
        f"SELECT {HEALTH_COLUMNS} FROM targets WHERE name = ?", (target,)
    ).fetchone()
    before, down_streak, down_since, probes, successes = row if row else (0, 0, None, 0, 0)
    connection.execute("INSERT OR IGNORE INTO targets (name) VALUES (?)", (target,))
    alone = False
    if attempt.target_at_fault and attempt.outcome == Verdict.RETRY:
        seen, flagged = connection.execute(
            "SELECT seen_successes, fails_alone FROM deliveries WHERE id = ?", (delivery_id,)
        ).fetchone()
        alone = fails_alone(flagged=bool(flagged), seen=seen, successes=successes)
        connection.execute(
            "UPDATE deliveries SET seen_successes = ?, fails_alone = ? WHERE id = ?",
            (successes, int(alone), delivery_id),
        )
    change = health_after(
        attempt,
        now,
        hold,
        before=before,
        down_streak=down_streak,
        down_since=down_since,
        probes=probes,
        successes=successes,
        alone=alone,
        delivery_id=delivery_id,
    )
    if change.columns:
        assignments = ", ".join(f"{column} = ?" for column in change.columns)
        connection.execute(
            f"UPDATE targets SET {assignments} WHERE name = ?", (*change.columns.values(), target)
        )
    if not change.count_waiting:
        return change.streak
    waited = connection.execute(
        "SELECT COUNT(*) FROM deliveries WHERE status = 'pending' AND target = ?", (target,)
    ).fetchone()[0]
    return replace(change.streak, waited=waited)


# While a target is down its deliveries' retry times mean nothing (none is
# spent): they line up by arrival instead, so the first probe is the oldest
# one (a failed probe goes to the back of the line: the next probe is another
# delivery, one bad payload cannot hold the target down) and, lined up again
# when it comes back, the backlog flows oldest first. Deliveries waiting for
# a predecessor (next_attempt_at NULL) are left alone.
LINE_UP_BY_ARRIVAL = """
UPDATE deliveries SET next_attempt_at =
    (SELECT received_at FROM events WHERE events.id = deliveries.event_id)
WHERE status = 'pending' AND target = ? AND next_attempt_at IS NOT NULL {only}
"""


def line_up_by_arrival(
    connection: sqlite3.Connection, target: str, delivery_id: int | None = None
) -> None:
    """Every pending delivery of a target that just went down, or one more."""
    if delivery_id is None:
        connection.execute(LINE_UP_BY_ARRIVAL.format(only=""), (target,))
    else:
        connection.execute(LINE_UP_BY_ARRIVAL.format(only="AND id = ?"), (target, delivery_id))


def delivery_after(
    then: Transition, attempt: AttemptRecord
) -> tuple[Status, float | None, str | None]:
    """(status, next_attempt_at, last_error) of a delivery after this attempt."""
    if isinstance(then, Delivered):
        return Status.DELIVERED, None, None
    if isinstance(then, RetryAt):
        return Status.PENDING, then.at, attempt.error
    if isinstance(then, Waits):
        return Status.PENDING, None, attempt.error
    return Status.DEAD, None, then.reason


def attempt_values(
    delivery_id: int, attempt: AttemptRecord, next_at: float | None, cycle_number: int | None
) -> tuple[object, ...]:
    """An attempt's row, in the order of ATTEMPT_COLUMNS_INSERTED; `cycle_number`:
    its step in its cycle, None when it is none (AttemptRecord.in_cycle)."""
    return (
        delivery_id,
        attempt.number,
        attempt.started_at,
        attempt.duration,
        attempt.outcome,
        attempt.http_status,
        attempt.error,
        attempt.response,
        next_at,
        attempt.kind.value,
        cycle_number,
        *request_values(attempt.request),
    )


def request_values(request: SentRequest | None) -> tuple[str | None, bytes | None]:
    """(request, request_body) columns of an attempt."""
    if request is None:
        return None, None
    head = {"method": request.method, "url": request.url, "headers": request.headers}
    return orjson.dumps(head).decode(), request.body


def sent_request(head: str | None, body: bytes | None) -> SentRequest | None:
    if head is None:
        return None
    values = orjson.loads(head)
    headers = tuple((str(name), str(value)) for name, value in values["headers"])
    return SentRequest(values["method"], values["url"], headers, bytes(body or b""))


ATTEMPT_COLUMNS_INSERTED = (
    "delivery_id, number, started_at, duration, outcome, http_status, error, response,"
    " next_attempt_at, kind, cycle_number, request, request_body"
)


def decode_headers(raw: bytes) -> list[Header]:
    return [(str(name), str(value)) for name, value in orjson.loads(raw)]


def delivery_view(row: Row) -> DeliveryView:
    return DeliveryView(
        id=row[0],
        event_id=row[1],
        target=row[2],
        status=Status(row[3]),
        attempts=row[4],
        attempts_in_cycle=row[5],
        next_attempt_at=row[6],
        last_error=row[7],
        updated_at=row[8],
        order_key=row[9],
        resolves=row[10],
        resolved_by=row[11],
    )


class Row(Protocol):
    """A result row of either backend (a tuple, sqlite3's, asyncpg's Record)."""

    def __getitem__(self, index: int, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


# Columns the mappings below read, in this order.
ATTEMPT_COLUMNS = (
    "delivery_id, number, started_at, duration, outcome, http_status, error, response,"
    " next_attempt_at, kind, cycle_number, request, request_body"
)
LOG_COLUMNS = "delivery_id, at, kind, detail, by"
RESEND_COLUMNS = "original_id, copy_id, at, by"


def event_view(row: Row, deliveries: Iterable[DeliveryView]) -> EventView:
    """An event in a listing, from a row of EVENT_LIST_COLUMNS."""
    return EventView(
        id=row[0],
        route=row[1],
        idempotency_key=row[2],
        received_at=row[3],
        remote_addr=row[4],
        deliveries=tuple(deliveries),
        conflict_of=row[5],
    )


def attempt_view(row: Row) -> AttemptView:
    """One attempt, from a row of ATTEMPT_COLUMNS."""
    return AttemptView(
        delivery_id=row[0],
        number=row[1],
        started_at=row[2],
        duration=row[3],
        outcome=row[4],
        http_status=row[5],
        error=row[6],
        response=bytes(row[7] or b""),
        next_attempt_at=row[8],
        kind=AttemptKind(row[9]),
        cycle_number=row[10],
        request=sent_request(row[11], row[12]),
    )


def log_entry(row: Row) -> LogEntry:
    """One history line, from a row of LOG_COLUMNS."""
    return LogEntry(row[0], row[1], row[2], row[3], row[4])


def resend_link(row: Row) -> ResendLink:
    """A corrected copy and its original, from a row of RESEND_COLUMNS."""
    return ResendLink(original_id=row[0], copy_id=row[1], at=row[2], by=row[3])


def event_detail(
    row: Row,
    deliveries: Sequence[DeliveryView],
    attempts: Iterable[Row],
    log: Iterable[Row],
    links: Iterable[Row],
) -> EventDetail:
    """One event with everything about it: `row` of EVENT_COLUMNS, then rows of
    ATTEMPT_COLUMNS and LOG_COLUMNS (oldest first) and of RESEND_COLUMNS."""
    by_attempt: dict[int, list[AttemptView]] = {delivery.id: [] for delivery in deliveries}
    by_log: dict[int, list[LogEntry]] = {delivery.id: [] for delivery in deliveries}
    for attempt in attempts:
        by_attempt[attempt[0]].append(attempt_view(attempt))
    for entry in log:
        by_log[entry[0]].append(log_entry(entry))
    event_id = row[0]
    resends = [resend_link(link) for link in links]
    return EventDetail(
        event=EventView(
            id=event_id,
            route=row[1],
            idempotency_key=row[2],
            received_at=row[3],
            remote_addr=row[4],
            deliveries=tuple(deliveries),
            conflict_of=row[11],
        ),
        payload=payload_of(row),
        attempts={key: tuple(value) for key, value in by_attempt.items()},
        log={key: tuple(value) for key, value in by_log.items()},
        resent_from=next((link for link in resends if link.copy_id == event_id), None),
        resent_as=tuple(link for link in resends if link.original_id == event_id),
    )


def claimed_delivery(delivery: Sequence[Any], event: Sequence[Any]) -> ClaimedDelivery:
    resume_status = delivery[6]
    return ClaimedDelivery(
        id=delivery[0],
        event_id=delivery[1],
        route=delivery[2],
        target=delivery[3],
        attempts=delivery[4],
        attempts_in_cycle=delivery[5],
        manual=resume_status is not None,
        resume_status=Status(resume_status) if resume_status is not None else None,
        resume_at=delivery[7],
        message_tag=delivery[8],
        idempotency_key=event[2],
        received_at=event[3],
        payload=payload_of(event),
        resolves=delivery[9],
    )


def payload_of(event: Row) -> Payload:
    """The request stored in `event`, a row of EVENT_COLUMNS."""
    return Payload(
        method=event[5],
        path=event[6],
        query=event[7],
        headers=decode_headers(event[8]),
        content_type=event[9],
        body=bytes(event[10]),
    )


def copy_event(original: Row, resend: Resend, now: float) -> NewEvent:
    """The corrected copy `resend` makes of `original` (a row of EVENT_COLUMNS):
    the same route, method, path and query, the edited headers and body."""
    return NewEvent(
        route=original[1],
        idempotency_key=None,
        received_at=now,
        remote_addr=None,
        payload=Payload(
            method=original[5],
            path=original[6],
            query=original[7],
            headers=resend.headers,
            content_type=resend.content_type,
            body=resend.body,
        ),
    )
