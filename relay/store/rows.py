"""The write side's shared SQL text and rows: ordering lines, a person's
verbs, the history and audit rows, an attempt's row, a corrected copy's
event (what a copy does to its original: relay.store.supersede).
SQLite's write jobs (relay.store.sqlite) run the SQL as it is; PostgreSQL's
numbered (relay.store.dialect) or in statements of its own, with the same
columns. What the store reads from a row is declared in relay.store.columns;
the reads' SQL is relay.store.reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from relay.core.outcome import SentRequest
from relay.core.payload import Payload
from relay.core.units import format_instant
from relay.store.base import (
    AUDIT_IDS_KEPT,
    INTERRUPTED_LIMIT,
    AttemptRecord,
    Delivered,
    NewEvent,
    Resend,
    RetryAt,
    Selection,
    Status,
    Superseded,
    Transition,
    Waits,
)
from relay.store.columns import FRESH_EVIDENCE, HELD_BEHIND
from relay.store.dialect import Dialect
from relay.store.shape import Written

# A delivery in flight at a start whose attempts since the last recorded one,
# the one cut short now counted, reach INTERRUPTED_LIMIT: each time relay
# stopped while sending it. It is parked dead (PARKED), whatever the reason,
# rather than attempted again: a stored event cannot keep stopping relay.
INTERRUPTED = (
    "attempts + 1 - COALESCE((SELECT MAX(a.number) FROM attempts a"
    f" WHERE a.delivery_id = deliveries.id), 0) >= {INTERRUPTED_LIMIT}"
)
PARKED = (
    f"relay stopped {INTERRUPTED_LIMIT} times in a row while sending it (a crash, a kill"
    " or the watchdog): parked so it cannot stop relay again; requeue it once the cause"
    " is known"
)
# What a start does to what was in flight: pending again, or parked (its SET,
# the parked reason its one parameter).
TAKEN_BACK = (
    f"status = CASE WHEN {INTERRUPTED} THEN 'dead' ELSE 'pending' END,"
    f" next_attempt_at = CASE WHEN {INTERRUPTED} THEN NULL ELSE next_attempt_at END,"
    f" last_error = CASE WHEN {INTERRUPTED} THEN ? ELSE last_error END,"
    " attempts = attempts + 1"
)

# The first unfinished delivery of a key: the only one of its line that may go.
HEAD_OF_LINE = f"""
SELECT {HELD_BEHIND.columns} FROM deliveries
WHERE target = ? AND order_key = ? AND status IN ('pending', 'in_flight', 'dead')
ORDER BY id LIMIT 1
"""
# When a delivery leaves its line (delivered, skipped, superseded), the next one is due.
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
INSERT_RESEND = "INSERT INTO resends (copy_id, original_id, at, by) VALUES (?, ?, ?, ?)"

# What retry_now reads of a delivery (relay.store.verbs.retry_now_step), its
# line's (order_by) and its copy's: (status, resume_status, next_attempt_at,
# target, order_key, resolved_by).
RETRY_STATE = (
    "SELECT status, resume_status, next_attempt_at, target, order_key, resolved_by"
    " FROM deliveries WHERE id = ?"
)
# What a person's verbs write (relay.store.verbs decides which applies).
# One more attempt now, then back to its schedule: (now, now, delivery id).
RETRY_FROM_PENDING = (
    "UPDATE deliveries SET resume_status = 'pending', resume_at = next_attempt_at,"
    " next_attempt_at = ?, updated_at = ? WHERE id = ?"
)
# One more attempt now, dead again if it fails: (now, now, delivery id).
RETRY_FROM_DEAD = (
    "UPDATE deliveries SET status = 'pending', resume_status = 'dead',"
    " resume_at = NULL, next_attempt_at = ?, updated_at = ? WHERE id = ?"
)
# A person's retry now of every delivery a Selection takes (pending or dead;
# verbs.retry_now_step for one): due now, to return where it was if it fails
# (a retry asked already keeps where it returns to). {where}: the selection's;
# (now, now, *its values).
RETRY_SELECTED = """
UPDATE deliveries SET resume_status = coalesce(resume_status, status),
    resume_at = CASE WHEN resume_status IS NOT NULL THEN resume_at
        WHEN status = 'pending' THEN next_attempt_at END,
    status = 'pending', next_attempt_at = ?, updated_at = ?
WHERE {where}
RETURNING id
"""
# The targets a Selection's deliveries go to, as a bulk retry now reads them:
# {where}: the selection's; (*its values) -> (name, paused, down, held until).
SELECTED_TARGETS = """
SELECT t.name, t.paused, t.down_since IS NOT NULL, t.throttled_until
FROM targets t WHERE t.name IN (SELECT DISTINCT target FROM deliveries WHERE {where})
"""
# Not to be sent: (last_error, now, delivery id).
SKIP = (
    "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL,"
    " resume_status = NULL, resume_at = NULL, last_error = ?, updated_at = ?"
    " WHERE id = ?"
)
# (name, paused, paused_at)
SET_PAUSED = (
    "INSERT INTO targets (name, paused, paused_at) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET paused = excluded.paused,"
    " paused_at = excluded.paused_at"
)
# A person resuming a down target wants to know now: probe at once. {least}:
# the dialect's smaller of two; (now, name).
PROBE_NOW = (
    "UPDATE targets SET probe_at = {least}(probe_at, ?) WHERE name = ? AND down_since IS NOT NULL"
)
# Deliveries kept pending for a target no longer configured say why:
# (UNCONFIGURED of the target, now, target).
UNCONFIGURED = "target {target} is not configured: kept pending until it is"
FLAG_UNCONFIGURED = (
    "UPDATE deliveries SET last_error = ?, updated_at = ?"
    " WHERE status IN ('pending', 'in_flight') AND target = ?"
)


def unconfigured(dialect: Dialect, configured: Sequence[str]) -> tuple[str, list[Any]]:
    """Per target not among `configured`, how many of its deliveries are
    pending or in flight: (target, count) rows."""
    outside, params = dialect.none_of("target", configured)
    return (
        "SELECT target, COUNT(*) FROM deliveries WHERE status IN ('pending', 'in_flight')"
        f" AND {outside} GROUP BY target",
        params,
    )


# A refused request, then the route's beyond the newest REJECTIONS_KEPT
# dropped: (route, at, remote_addr, reason, detail, headers), (route, route, kept).
INSERT_REJECTION = (
    "INSERT INTO rejections (route, at, remote_addr, reason, detail, headers)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
PRUNE_REJECTIONS = (
    "DELETE FROM rejections WHERE route = ? AND id <= (SELECT id FROM rejections"
    " WHERE route = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"
)
# A line of a delivery's history: (delivery id, at, kind, detail, by).
INSERT_LOG = "INSERT INTO delivery_log (delivery_id, at, kind, detail, by) VALUES (?, ?, ?, ?, ?)"

INSERT_AUDIT = (
    "INSERT INTO audit (at, by, action, subject, count, deliveries) VALUES (?, ?, ?, ?, ?, ?)"
)


def audit_values(
    now: float, by: str, action: str, subject: str, delivery_ids: Sequence[int]
) -> tuple[object, ...]:
    """An audit row, in the order of INSERT_AUDIT."""
    kept = orjson.dumps(list(delivery_ids[:AUDIT_IDS_KEPT])).decode()
    return (now, by, action, subject, len(delivery_ids), kept)


def resend_subject(resend: Resend, copy_id: int, superseded: Sequence[int] = ()) -> str:
    """What a resend's audit entry names: the copy, and the deliveries it
    stands in for (relay.store.supersede): each stopped, or, in flight then,
    settled by the attempt under way."""
    said = f"event {resend.original_id} as event {copy_id}, to {', '.join(resend.targets)}"
    if superseded:
        said += f"; stands in for delivery {', '.join(str(i) for i in superseded)}"
    return said


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


def probe_choice(target: str, now: str | None) -> str:
    """SQL: the id of the delivery a down target's next probe takes, the
    target named by the SQL `target`, due by `now` (None: whenever due).
    Fresh evidence first (columns.FRESH_EVIDENCE), the oldest: a person is
    waiting for it, and the target may well take it; else the first in line
    (LINE_UP_BY_ARRIVAL). Each a range of the due index, never a sort of
    the whole backlog."""
    due = f" AND d.next_attempt_at <= {now}" if now is not None else ""
    probed = f"(SELECT t.probed_at FROM targets t WHERE t.name = {target})"
    return (
        "coalesce("
        "(SELECT d.id FROM deliveries d JOIN events e ON e.id = d.event_id"
        f" WHERE d.target = {target}{due} AND {FRESH_EVIDENCE.format(probed=probed)}"
        " ORDER BY d.next_attempt_at, d.id LIMIT 1),"
        f" (SELECT d.id FROM deliveries d WHERE d.status = 'pending' AND d.target = {target}"
        f"{due} AND d.next_attempt_at IS NOT NULL ORDER BY d.next_attempt_at, d.id LIMIT 1))"
    )


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
# Coming back: every one, the backlog flows at once.
LINE_UP_ALL = LINE_UP_BY_ARRIVAL.format(only="")
# Going down, or failing while down: only those whose own retry time comes by
# the next probe. One that failed just before with a longer backoff keeps its
# time, so that no probe sends it again before its backoff is over.
_BY_THE_PROBE = "AND next_attempt_at <= (SELECT probe_at FROM targets WHERE targets.name = ?)"
# (target, target), and (target, target, delivery id)
LINE_UP_DOWN = LINE_UP_BY_ARRIVAL.format(only=_BY_THE_PROBE)
LINE_UP_ONE_DOWN = LINE_UP_BY_ARRIVAL.format(only=f"{_BY_THE_PROBE} AND id = ?")


def delivery_after(then: Transition, error: str | None) -> tuple[Status, float | None, str | None]:
    """(status, next_attempt_at, last_error) of a delivery going on to `then`
    after an attempt that failed with `error` (if it did)."""
    if isinstance(then, Delivered):
        return Status.DELIVERED, None, None
    if isinstance(then, RetryAt | Waits):
        return Status.PENDING, then.at, error
    if isinstance(then, Superseded):
        return Status.SUPERSEDED, None, error
    return Status.DEAD, None, then.reason


# An attempt's row, made by attempt_values.
NEW_ATTEMPT = Written(
    "attempts",
    delivery_id="bigint",
    number="int",
    started_at="float8",
    duration="float8",
    outcome="text",
    http_status="int",
    error="text",
    response="bytea",
    next_attempt_at="float8",
    kind="text",
    cycle_number="int",
    request="text",
    request_body="bytea",
)


def attempt_values(
    delivery_id: int, attempt: AttemptRecord, next_at: float | None, cycle_number: int | None
) -> tuple[object, ...]:
    """An attempt's row, NEW_ATTEMPT's columns in order; `cycle_number`: its
    step in its cycle, None when it is none (Step.in_cycle)."""
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
    head = {
        "method": request.method,
        "url": request.url,
        "headers": request.headers,
        "size": request.size,
    }
    return orjson.dumps(head).decode(), request.body


def copy_event(original: NewEvent, resend: Resend, now: float) -> NewEvent:
    """The corrected copy `resend` makes of `original` (columns.STORED_EVENT):
    the same route, method, path and query, the edited headers and body."""
    return NewEvent(
        route=original.route,
        idempotency_key=None,
        received_at=now,
        remote_addr=None,
        payload=Payload(
            method=original.payload.method,
            path=original.payload.path,
            query=original.payload.query,
            headers=resend.headers,
            content_type=resend.content_type,
            body=resend.body,
        ),
    )
