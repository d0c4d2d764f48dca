"""A corrected copy stops its original, on PostgreSQL (the rule: relay.store.supersede).

As SQLite's (relay.store.sqlite.supersede), with the locks instances need: a
resend locks the line, then the row, of each delivery it stops (as an
attempt's record does, relay.store.postgres.record.lock_lines), so a record
of that delivery's attempt either committed before (the resend sees how it
ended) or waits for the resend and sees the link; whichever statement of the
record runs after its delivery's row was written sees the copy's delivery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import relay.store.supersede as rule
from relay.store.base import ClaimedDelivery, Delivered, Status, Step, Superseded
from relay.store.dialect import numbered
from relay.store.postgres.errors import Connection
from relay.store.postgres.writes import insert_log, lock_lines, next_in_line

LINK_COPY = numbered(rule.LINK_COPY)  # (original event, copy event)
COPY_DELIVERIES = numbered(rule.COPY_DELIVERIES)
# Read locked: the resend decides from it and writes it in one transaction.
LINK_STATE = numbered(rule.LINK_STATE) + " FOR UPDATE"
SET_RESOLVES = numbered(rule.SET_RESOLVES)
SUPERSEDE = numbered(rule.SUPERSEDE)
MARK_IN_FLIGHT = numbered(rule.MARK_IN_FLIGHT)
SUPERSEDED_AFTER = numbered(rule.SUPERSEDED_AFTER)
SKIP_WAITING_COPY = numbered(rule.SKIP_WAITING_COPY)
UNLINK = numbered(rule.UNLINK)
RESOLVE = numbered(rule.RESOLVE)  # (resolved by, now, original delivery)
STOP = rule.STOP_UNFINISHED.replace(
    "{leases}", "lease_until = NULL, lease_owner = NULL, lease_expires = NULL"
)


async def link_copy(
    connection: Connection, original: int, copy_event: int, now: float, by: str
) -> list[int]:
    """As SQLite's link_copy: each delivery of a new corrected copy linked to
    the one it stands in for, which is stopped. The deliveries superseded or
    linked."""
    await connection.execute(LINK_COPY, original, copy_event)
    touched: list[int] = []
    for copy, first in await connection.fetch(COPY_DELIVERIES, copy_event):
        if first is None:
            continue
        at = int(first)
        status, resolved_by = await _locked(connection, at)
        for _ in range(rule.CHAIN_DEPTH):
            after = rule.follows(status, resolved_by)
            if after is None:
                break
            at = after
            status, resolved_by = await _locked(connection, at)
        if at != first:
            await connection.execute(SET_RESOLVES, at, copy)
        step = rule.on_copy(status)
        if step is rule.OnCopy.AT_ONCE:
            await connection.execute(SUPERSEDE, copy, now, at)
            detail = rule.superseded_now(status, copy, copy_event)
            await insert_log(connection, [at], now, rule.SUPERSEDED, detail, by)
            await next_in_line(connection, [at], now)
            touched.append(at)
        elif step is rule.OnCopy.AFTER_ATTEMPT:
            if resolved_by is not None:
                # An earlier copy waits for this attempt: this one takes its place.
                done = await connection.execute(SUPERSEDE, copy, now, resolved_by)
                if done.split()[-1] != "0":
                    detail = rule.superseded_now(Status.PENDING, copy, copy_event)
                    await insert_log(connection, [resolved_by], now, rule.SUPERSEDED, detail, by)
                    touched.append(resolved_by)
            await connection.execute(MARK_IN_FLIGHT, copy, at)
            detail = rule.waits_for_attempt(copy, copy_event)
            await insert_log(connection, [at], now, rule.COPY, detail, by)
            touched.append(at)
    return touched


async def _locked(connection: Connection, delivery_id: int) -> tuple[Status, int | None]:
    """A delivery's state for the chain, its line then its row locked (lock_lines:
    one order with every other writer of both)."""
    await lock_lines(connection, [delivery_id])
    row = await connection.fetchrow(LINK_STATE, delivery_id)
    assert row is not None  # a delivery of a stored event, or a link to one
    status, resolved_by = row
    return Status(status), resolved_by


async def settle_attempt(
    connection: Connection, delivery: ClaimedDelivery, copy: int, step: Step, now: float
) -> Step:
    """As SQLite's settle_attempt: delivered, the waiting copy is skipped; else
    the delivery stops and the copy goes. The step as it ended."""
    if isinstance(step.then, Delivered):
        await delivered_while_waiting(connection, delivery.id, copy, now)
        return step
    await connection.execute(SUPERSEDED_AFTER, now, delivery.id)
    detail = rule.superseded_after(copy)
    await insert_log(connection, [delivery.id], now, rule.SUPERSEDED, detail)
    await next_in_line(connection, [delivery.id], now)
    return replace(step, then=Superseded(copy))


async def delivered_while_waiting(
    connection: Connection, delivery_id: int, copy: int, now: float
) -> None:
    """`delivery_id` was delivered while a corrected copy (`copy`) waited: the copy is skipped."""
    reason = rule.copy_not_needed(delivery_id)
    done = await connection.execute(SKIP_WAITING_COPY, reason, now, copy, delivery_id)
    if done.split()[-1] != "0":
        await insert_log(connection, [copy], now, "skip", reason)
    await connection.execute(UNLINK, delivery_id)
    detail = rule.delivered_while_waiting(copy)
    await insert_log(connection, [delivery_id], now, rule.COPY, detail)


async def stop_unfinished(
    connection: Connection,
    which: str,
    params: Sequence[object],
    now: float,
    *,
    interrupted: bool,
) -> int:
    """As SQLite's stop_unfinished; `which` in numbered placeholders from $3.
    The caller has locked their lines."""
    stopped = await connection.fetch(
        numbered(STOP).format(which=which), now, 1 if interrupted else 0, *params
    )
    for delivery_id, copy in stopped:
        detail = rule.superseded_unfinished(copy)
        await insert_log(connection, [delivery_id], now, rule.SUPERSEDED, detail)
    await next_in_line(connection, [delivery_id for delivery_id, _ in stopped], now)
    return len(stopped)


async def resolve_originals(
    connection: Connection, delivery_id: int, event_id: int, original: int | None, now: float
) -> None:
    """As SQLite's resolve_originals: a delivered corrected copy resolves what
    it superseded, up a chain of copies."""
    for _ in range(rule.CHAIN_DEPTH):
        if original is None:
            return
        await lock_lines(connection, [original])  # before its row (RESOLVE)
        resolved = await connection.fetchrow(RESOLVE, delivery_id, now, original)
        if resolved is None:
            return
        detail = rule.resolved_by_copy(delivery_id, event_id)
        await insert_log(connection, [original], now, "resolved", detail)
        await next_in_line(connection, [original], now)
        (original,) = resolved  # the delivery the original itself stands for, if a copy
