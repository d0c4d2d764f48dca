"""SQL text and row mapping shared by the SQLite store's reads and write jobs."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from relay.outcome import Verdict
from relay.store.base import (
    AttemptRecord,
    ClaimedDelivery,
    DeliveryView,
    FailureStreak,
    Header,
    Hold,
    Selection,
    Status,
    TextSearch,
)

EVENT_COLUMNS = (
    "id, route, idempotency_key, received_at, remote_addr, method, path, query, headers,"
    " content_type, body, conflict_of"
)
DELIVERY_COLUMNS = (
    "id, event_id, target, status, attempts, cycle_attempts, next_attempt_at, last_error,"
    " updated_at, order_key"
)
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
    "RETURNING id, event_id, route, target, attempts, cycle_attempts, resume_status, resume_at"
)
CLAIM_DUE = f"""
UPDATE deliveries SET status = 'in_flight', lease_until = ?, updated_at = ?
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'pending' AND target = ? AND next_attempt_at <= ?
    ORDER BY next_attempt_at, id LIMIT ?)
{CLAIM_RETURNING}
"""
CLAIM_EXPIRED = f"""
UPDATE deliveries SET lease_until = ?, updated_at = ?
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'in_flight' AND target = ? AND lease_until <= ? {{exclude}}
    ORDER BY lease_until LIMIT ?)
{CLAIM_RETURNING}
"""


def placeholders(count: int) -> str:
    return ",".join("?" * count)


def selection_where(selection: Selection) -> tuple[str, list[Any]]:
    where = ["status = ?"]
    params: list[Any] = [selection.status.value]
    for clause, value in (("route = ?", selection.route), ("target = ?", selection.target)):
        if value is not None:
            where.append(clause)
            params.append(value)
    if selection.ids:
        where.append(f"id IN ({placeholders(len(selection.ids))})")
        params += selection.ids
    if selection.since is not None or selection.until is not None:
        where.append(
            "event_id IN (SELECT id FROM events WHERE received_at >= ? AND received_at < ?)"
        )
        params += [
            selection.since if selection.since is not None else float("-inf"),
            selection.until if selection.until is not None else float("inf"),
        ]
    return " AND ".join(where), params


def match_expression(search: TextSearch) -> str:
    """An FTS5 query: each word a quoted phrase (a substring, for the trigram
    tokenizer) of the text column, all required; or the digits as one phrase."""
    if search.digits is not None:
        return "{digits}: " + _phrase(search.digits)
    return " AND ".join("{text}: " + _phrase(word) for word in search.words)


def _phrase(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def select_delivery(connection: sqlite3.Connection, delivery_id: int) -> Sequence[Any]:
    row: Sequence[Any] = connection.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    return row


def insert_log(
    connection: sqlite3.Connection, delivery_ids: Iterable[int], now: float, kind: str, detail: str
) -> None:
    connection.executemany(
        "INSERT INTO delivery_log (delivery_id, at, kind, detail) VALUES (?, ?, ?, ?)",
        [(delivery_id, now, kind, detail) for delivery_id in delivery_ids],
    )


def update_health(
    connection: sqlite3.Connection,
    target: str,
    attempt: AttemptRecord,
    now: float,
    hold: Hold | None,
) -> FailureStreak:
    row = connection.execute(
        "SELECT consecutive_failures, down_streak, down_since FROM targets WHERE name = ?",
        (target,),
    ).fetchone()
    before, down_streak, down_since = row if row else (0, 0, None)
    connection.execute("INSERT OR IGNORE INTO targets (name) VALUES (?)", (target,))
    if not attempt.target_at_fault:
        # The event could not be sent as rendered: nothing was learnt about the target.
        return FailureStreak(before, before, down=down_since is not None)
    succeeded = attempt.outcome == Verdict.SUCCESS
    # A retry outcome (network, timeout, 5xx, 429) says the target may be down;
    # any answer about the payload (success, a 4xx) says it is up.
    down_signal = attempt.outcome == Verdict.RETRY
    down_streak = down_streak + 1 if down_signal else 0
    if succeeded:
        after = 0
        connection.execute(
            "UPDATE targets SET last_success_at = ?, consecutive_failures = 0, down_streak = 0"
            " WHERE name = ?",
            (now, target),
        )
    else:
        after = before + 1
        connection.execute(
            "UPDATE targets SET last_error_at = ?, last_error = ?, consecutive_failures = ?,"
            " down_streak = ? WHERE name = ?",
            (now, attempt.error, after, down_streak, target),
        )
    if down_since is not None and not down_signal:
        waited = connection.execute(
            "SELECT COUNT(*) FROM deliveries WHERE status = 'pending' AND target = ?", (target,)
        ).fetchone()[0]
        connection.execute(
            "UPDATE targets SET down_since = NULL, probe_at = NULL, probes = 0 WHERE name = ?",
            (target,),
        )
        return FailureStreak(before, after, came_up=True, waited=waited, down_for=now - down_since)
    if hold is None or not down_signal:
        return FailureStreak(before, after, down=down_since is not None)
    if down_since is None and down_streak >= hold.down_after:
        connection.execute(
            "UPDATE targets SET down_since = ?, probe_at = ?, probes = 0 WHERE name = ?",
            (now, hold.probe_at, target),
        )
        return FailureStreak(before, after, went_down=True, down=True)
    if down_since is not None and hold.probe:
        connection.execute(
            "UPDATE targets SET probe_at = ?, probes = probes + 1 WHERE name = ?",
            (hold.probe_at, target),
        )
    return FailureStreak(before, after, down=down_since is not None)


# While a target is down its deliveries' retry times mean nothing (none is
# spent): they line up by arrival instead, so the probe is the oldest one and
# the backlog flows oldest first when the target is back. Deliveries waiting
# for a predecessor (next_attempt_at NULL) are left alone.
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


def decode_headers(raw: bytes) -> list[Header]:
    return [(str(name), str(value)) for name, value in orjson.loads(raw)]


def delivery_view(row: Sequence[Any]) -> DeliveryView:
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
        idempotency_key=event[2],
        received_at=event[3],
        remote_addr=event[4],
        method=event[5],
        path=event[6],
        query=event[7],
        headers=decode_headers(event[8]),
        content_type=event[9],
        body=bytes(event[10]),
    )
