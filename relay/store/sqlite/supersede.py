"""A corrected copy stops its original, on SQLite (the rule: relay.store.supersede).

Each function runs inside a job of the writer thread, the database's one
write transaction: what it reads is what it writes over.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace

from relay.store.base import ClaimedDelivery, Delivered, Status, Step, Superseded
from relay.store.rows import NEXT_IN_LINE
from relay.store.sqlite.writes import insert_log
from relay.store.supersede import (
    CHAIN_DEPTH,
    COPY,
    COPY_DELIVERIES,
    LINK_COPY,
    LINK_STATE,
    MARK_IN_FLIGHT,
    RESOLVE,
    SET_RESOLVES,
    SKIP_WAITING_COPY,
    STOP_UNFINISHED,
    SUPERSEDE,
    SUPERSEDED,
    SUPERSEDED_AFTER,
    UNLINK,
    OnCopy,
    copy_not_needed,
    delivered_while_waiting,
    follows,
    on_copy,
    resolved_by_copy,
    superseded_after,
    superseded_now,
    superseded_unfinished,
    waits_for_attempt,
)


def link_copy(
    connection: sqlite3.Connection, original: int, copy_event: int, now: float, by: str
) -> list[int]:
    """Link each delivery of a new corrected copy to the delivery it stands in
    for, and stop that one (supersede.on_copy). Returns the deliveries
    superseded or linked."""
    connection.execute(LINK_COPY, (original, copy_event))
    touched: list[int] = []
    for copy, first in connection.execute(COPY_DELIVERIES, (copy_event,)).fetchall():
        if first is None:  # the original has no delivery to this target
            continue
        at = first
        status, resolved_by = _state(connection, at)
        for _ in range(CHAIN_DEPTH):
            after = follows(status, resolved_by)
            if after is None:
                break
            at = after
            status, resolved_by = _state(connection, at)
        if at != first:
            connection.execute(SET_RESOLVES, (at, copy))
        step = on_copy(status)
        if step is OnCopy.AT_ONCE:
            connection.execute(SUPERSEDE, (copy, now, at))
            insert_log(
                connection, [at], now, SUPERSEDED, superseded_now(status, copy, copy_event), by
            )
            connection.execute(NEXT_IN_LINE, (now, now, at))
            touched.append(at)
        elif step is OnCopy.AFTER_ATTEMPT:
            # An earlier copy waits for this attempt: this one takes its place.
            if (
                resolved_by is not None
                and connection.execute(SUPERSEDE, (copy, now, resolved_by)).rowcount
            ):
                detail = superseded_now(Status.PENDING, copy, copy_event)
                insert_log(connection, [resolved_by], now, SUPERSEDED, detail, by)
                touched.append(resolved_by)
            connection.execute(MARK_IN_FLIGHT, (copy, at))
            insert_log(connection, [at], now, COPY, waits_for_attempt(copy, copy_event), by)
            touched.append(at)
    return touched


def _state(connection: sqlite3.Connection, delivery_id: int) -> tuple[Status, int | None]:
    status, resolved_by = connection.execute(LINK_STATE, (delivery_id,)).fetchone()
    return Status(status), resolved_by


def settle_attempt(
    connection: sqlite3.Connection, delivery: ClaimedDelivery, copy: int, step: Step, now: float
) -> Step:
    """`delivery`'s attempt, just recorded as `step` says, was under way when a
    corrected copy (`copy`) was made: delivered, the copy is not sent; else
    the delivery stops and the copy goes. The step as it ended."""
    if isinstance(step.then, Delivered):
        reason = copy_not_needed(delivery.id)
        if connection.execute(SKIP_WAITING_COPY, (reason, now, copy, delivery.id)).rowcount:
            insert_log(connection, [copy], now, "skip", reason)
        connection.execute(UNLINK, (delivery.id,))
        insert_log(connection, [delivery.id], now, COPY, delivered_while_waiting(copy))
        return step
    connection.execute(SUPERSEDED_AFTER, (now, delivery.id))
    insert_log(connection, [delivery.id], now, SUPERSEDED, superseded_after(copy))
    connection.execute(NEXT_IN_LINE, (now, now, delivery.id))
    return replace(step, then=Superseded(copy))


STOP = STOP_UNFINISHED.replace("{leases}", "lease_until = NULL")


def stop_unfinished(
    connection: sqlite3.Connection,
    which: str,
    params: Sequence[object],
    now: float,
    *,
    interrupted: bool,
) -> int:
    """Linked deliveries in flight (`which`) whose attempt will never be
    recorded: superseded, their copies go. `interrupted`: their attempt may
    have reached the receiver, and is counted. Returns how many."""
    stopped = connection.execute(
        STOP.format(which=which), (now, 1 if interrupted else 0, *params)
    ).fetchall()
    for delivery_id, copy in stopped:
        insert_log(connection, [delivery_id], now, SUPERSEDED, superseded_unfinished(copy))
        connection.execute(NEXT_IN_LINE, (now, now, delivery_id))
    return len(stopped)


def resolve_originals(
    connection: sqlite3.Connection, delivery: ClaimedDelivery, now: float
) -> None:
    """`delivery`, of a corrected copy, was delivered: resolve what it stands for."""
    original = delivery.resolves
    for _ in range(CHAIN_DEPTH):
        if original is None:
            return
        resolved = connection.execute(RESOLVE, (delivery.id, now, original)).fetchone()
        if resolved is None:  # delivered meanwhile, skipped...: left as it is
            return
        detail = resolved_by_copy(delivery.id, delivery.event_id)
        insert_log(connection, [original], now, "resolved", detail)
        connection.execute(NEXT_IN_LINE, (now, now, original))
        (original,) = resolved  # the delivery the original itself stands for, if a copy
