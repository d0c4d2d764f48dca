"""The PostgreSQL store's operations: what a person does to deliveries and events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import relay.store.rows as rows
from relay.store.accept import AcceptJob
from relay.store.base import (
    UNKNOWN,
    Conflict,
    DeliveryView,
    NewDelivery,
    NotFound,
    Resend,
    RetriedNow,
    Selection,
    Status,
)
from relay.store.columns import DELIVERY, HELD_BEHIND, STORED_EVENT
from relay.store.dialect import POSTGRES, numbered
from relay.store.postgres.accept import store_batch
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection
from relay.store.postgres.supersede import link_copy
from relay.store.postgres.writes import insert_log, lock_lines, next_in_line
from relay.store.reads import selection_where
from relay.store.rows import copy_event, describe_selection, resend_subject
from relay.store.verbs import (
    REQUEUED,
    RETRIED,
    Missing,
    NotApplicable,
    RetryNow,
    VerbResult,
    may_skip,
    outcome,
    paused,
    requeued,
    retried,
    retry_now_step,
    skipped,
    skipped_error,
    waiting_behind,
)

# The ordering lines' SQL is SQLite's, numbered (one text, one meaning).
HEAD_OF_LINE = numbered(rows.HEAD_OF_LINE)
# A person's verbs write what SQLite's do.
INSERT_RESEND = numbered(rows.INSERT_RESEND)
RETRY_FROM_PENDING = numbered(rows.RETRY_FROM_PENDING)
RETRY_FROM_DEAD = numbered(rows.RETRY_FROM_DEAD)
SKIP = numbered(rows.SKIP)
SET_PAUSED = numbered(rows.SET_PAUSED)
PROBE_NOW = numbered(rows.PROBE_NOW.format(least=POSTGRES.least))
# Locked: the verb decides from it and writes it in one transaction.
RETRY_STATE = numbered(rows.RETRY_STATE) + " FOR UPDATE"
INSERT_AUDIT = numbered(rows.INSERT_AUDIT)
SELECT_DELIVERY = f"SELECT {DELIVERY.columns} FROM deliveries WHERE id = $1"


class PostgresOperations(PostgresConnection):
    async def resend(self, resend: Resend, now: float) -> int:
        async def job(connection: Connection) -> int | None:
            row = await connection.fetchrow(
                f"SELECT {STORED_EVENT.columns} FROM events WHERE id = $1", resend.original_id
            )
            if row is None:
                return None
            event = copy_event(STORED_EVENT.from_row(row), resend, now)
            deliveries = [NewDelivery(target) for target in resend.targets]
            [accepted] = await store_batch(connection, [AcceptJob(event, deliveries, now)])
            await connection.execute(
                INSERT_RESEND, accepted.event_id, resend.original_id, now, resend.by
            )
            stopped = await link_copy(
                connection, resend.original_id, accepted.event_id, now, resend.by
            )
            copies = [
                int(delivery_id)
                for (delivery_id,) in await connection.fetch(
                    "SELECT id FROM deliveries WHERE event_id = $1 ORDER BY id", accepted.event_id
                )
            ]
            subject = resend_subject(resend, accepted.event_id, stopped)
            touched = [*copies, *stopped]
            await _insert_audit(connection, now, resend.by, "resend", subject, touched)
            return accepted.event_id

        # Made twice, a resend is two copies: two orders in the CRM.
        copy_id = await self._write_settled(job, ("resend", resend))
        if copy_id is None:
            raise NotFound(f"no event {resend.original_id}")
        await self._wake("resend")
        return copy_id

    async def retry_now(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        async def job(connection: Connection) -> VerbResult:
            row = await connection.fetchrow(RETRY_STATE, delivery_id)
            if row is None:
                return Missing()
            was, resume_status, next_attempt_at, target, order_key, resolved_by = row
            status = Status(was)
            step = retry_now_step(status, resume_status, next_attempt_at, order_key, resolved_by)
            if isinstance(step, NotApplicable):
                return step
            if step is RetryNow.WAITING_TURN:
                head = await connection.fetchrow(HEAD_OF_LINE, target, order_key)
                assert head is not None  # it is in its line, so the line has a head
                held = HELD_BEHIND.from_row(head)
                return waiting_behind(held.delivery_id, held.status)
            if step is RetryNow.FROM_PENDING:
                await connection.execute(RETRY_FROM_PENDING, now, now, delivery_id)
            elif step is RetryNow.FROM_DEAD:
                await connection.execute(RETRY_FROM_DEAD, now, now, delivery_id)
            else:
                return await _select_delivery(connection, delivery_id)
            await insert_log(connection, [delivery_id], now, "retry", retried(status), by)
            await _insert_audit(
                connection, now, by, "retry", f"delivery {delivery_id}", [delivery_id]
            )
            return await _select_delivery(connection, delivery_id)

        result = outcome(delivery_id, await self._write(job))
        await self._wake("retry")
        return result

    async def skip(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        async def job(connection: Connection) -> VerbResult:
            await lock_lines(connection, [delivery_id])
            status_text = await connection.fetchval(
                "SELECT status FROM deliveries WHERE id = $1 FOR UPDATE", delivery_id
            )
            if status_text is None:
                return Missing()
            status = Status(status_text)
            if (refused := may_skip(status)) is not None:
                return refused
            await connection.execute(SKIP, skipped_error(status), now, delivery_id)
            await insert_log(connection, [delivery_id], now, "skip", skipped(status), by)
            await _insert_audit(
                connection, now, by, "skip", f"delivery {delivery_id}", [delivery_id]
            )
            await next_in_line(connection, [delivery_id], now)
            return await _select_delivery(connection, delivery_id)

        result = outcome(delivery_id, await self._write(job))
        await self._wake("skip")
        return result

    async def requeue(self, selection: Selection, now: float, *, by: str = UNKNOWN) -> list[int]:
        if selection.status not in REQUEUED:
            return []
        where, params = selection_where(selection, POSTGRES)

        async def job(connection: Connection) -> list[int]:
            ids = [
                delivery_id
                for (delivery_id,) in await connection.fetch(
                    # A delivered or skipped one sent again is a person's resend,
                    # outside its key's order (it would otherwise cut in line).
                    "UPDATE deliveries SET status = 'pending', cycle_attempts = 0,"
                    " fails_alone = false, next_attempt_at = $1, lease_until = NULL,"
                    " lease_owner = NULL,"
                    " resume_status = NULL, resume_at = NULL, updated_at = $1,"
                    " order_key = CASE WHEN status IN ('delivered', 'skipped')"
                    " THEN NULL ELSE order_key END"
                    f" WHERE {numbered(where, 2)} RETURNING id",
                    now,
                    *params,
                )
            ]
            ids.sort()
            await insert_log(connection, ids, now, "requeue", requeued(selection.status), by)
            subject = describe_selection(selection)
            await _insert_audit(connection, now, by, "requeue", subject, ids)
            return ids

        # Made twice, a requeue of delivered deliveries sends them twice more.
        ids = await self._write_settled(job, ("requeue", selection))
        if ids:
            await self._wake("requeue")
        return ids

    async def retry_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> RetriedNow:
        if selection.status not in RETRIED:
            return RetriedNow([])
        sendable = replace(selection, sendable=True)
        where, params = selection_where(sendable, POSTGRES)

        async def job(connection: Connection) -> RetriedNow | str:
            targets = await connection.fetch(
                numbered(rows.SELECTED_TARGETS.format(where=where)), *params
            )
            refused = sorted(name for name, paused_, _, _ in targets if paused_)
            if refused:
                return paused(refused)
            # Targets first, then deliveries: the order an attempt's record locks them.
            probed = sorted(name for name, _, down, _ in targets if down)
            for name in probed:
                await connection.execute(PROBE_NOW, now, name)
            ids = sorted(
                int(delivery_id)
                for (delivery_id,) in await connection.fetch(
                    numbered(rows.RETRY_SELECTED.format(where=where)), now, now, *params
                )
            )
            await insert_log(connection, ids, now, "retry", retried(selection.status), by)
            subject = describe_selection(sendable)
            await _insert_audit(connection, now, by, "retry", subject, ids)
            held = {name: until for name, _, _, until in targets if until and until > now}
            return RetriedNow(ids, probed, held)

        # Made twice, it is asked twice: the second finds them asked already.
        result = await self._write(job)
        if isinstance(result, str):
            raise Conflict(result)
        if result.ids or result.probed:
            await self._wake("retry")
        return result

    async def skip_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> list[int]:
        if selection.status not in (Status.PENDING, Status.DEAD):
            return []
        where, params = selection_where(selection, POSTGRES)
        was = selection.status.value

        async def job(connection: Connection) -> list[int]:
            # Their lines first (record.lock_lines), then the rows, in id
            # order: an attempt's record or another skip waits.
            await lock_lines(
                connection,
                [
                    int(delivery_id)
                    for (delivery_id,) in await connection.fetch(
                        f"SELECT id FROM deliveries WHERE {numbered(where)}", *params
                    )
                ],
            )
            ids = [
                int(delivery_id)
                for (delivery_id,) in await connection.fetch(
                    f"SELECT id FROM deliveries WHERE {numbered(where)} ORDER BY id FOR UPDATE",
                    *params,
                )
            ]
            for delivery_id in ids:
                await connection.execute(SKIP, skipped_error(was), now, delivery_id)
            await next_in_line(connection, ids, now)
            await insert_log(connection, ids, now, "skip", skipped(was), by)
            subject = describe_selection(selection)
            await _insert_audit(connection, now, by, "skip", subject, ids)
            return ids

        ids = await self._write(job)
        if ids:
            await self._wake("skip")
        return ids

    async def set_paused(self, target: str, paused: bool, now: float, *, by: str = UNKNOWN) -> None:
        async def job(connection: Connection) -> None:
            action = "pause" if paused else "resume"
            await _insert_audit(connection, now, by, action, f"target {target}")
            await connection.execute(SET_PAUSED, target, paused, now if paused else None)
            if not paused:
                await connection.execute(PROBE_NOW, now, target)

        await self._write(job)
        await self._wake("pause")


async def _select_delivery(connection: Connection, delivery_id: int) -> DeliveryView:
    row = await connection.fetchrow(SELECT_DELIVERY, delivery_id)
    assert row is not None  # the caller holds its lock
    return DELIVERY.from_row(row)


async def _insert_audit(
    connection: Connection,
    now: float,
    by: str,
    action: str,
    subject: str,
    delivery_ids: Sequence[int] = (),
) -> None:
    await connection.execute(
        INSERT_AUDIT, *rows.audit_values(now, by, action, subject, delivery_ids)
    )
