"""The SQLite store's operations: what a person does to deliveries and events."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
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
from relay.store.columns import HELD_BEHIND, STORED_EVENT
from relay.store.dialect import SQLITE
from relay.store.reads import selection_where
from relay.store.rows import (
    HEAD_OF_LINE,
    INSERT_RESEND,
    NEXT_IN_LINE,
    RETRY_FROM_DEAD,
    RETRY_FROM_PENDING,
    RETRY_SELECTED,
    RETRY_STATE,
    SELECTED_TARGETS,
    SET_PAUSED,
    SKIP,
    copy_event,
    describe_selection,
    resend_subject,
)
from relay.store.sqlite.accept import SqliteAccept
from relay.store.sqlite.connection import SqliteConnection
from relay.store.sqlite.supersede import link_copy
from relay.store.sqlite.writes import delivery, insert_audit, insert_log
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

PROBE_NOW = rows.PROBE_NOW.format(least=SQLITE.least)  # (now, target)


class SqliteOperations(SqliteConnection):
    async def resend(self, resend: Resend, now: float) -> int:
        def job(connection: sqlite3.Connection) -> int | None:
            row = connection.execute(
                f"SELECT {STORED_EVENT.columns} FROM events WHERE id = ?", (resend.original_id,)
            ).fetchone()
            if row is None:
                return None
            event = copy_event(STORED_EVENT.from_row(row), resend, now)
            deliveries = [NewDelivery(target) for target in resend.targets]
            [accepted] = SqliteAccept.run_many(connection, [AcceptJob(event, deliveries, now)])
            copy_id = accepted.event_id
            connection.execute(INSERT_RESEND, (copy_id, resend.original_id, now, resend.by))
            stopped = link_copy(connection, resend.original_id, copy_id, now, resend.by)
            copies = [
                delivery_id
                for (delivery_id,) in connection.execute(
                    "SELECT id FROM deliveries WHERE event_id = ? ORDER BY id", (copy_id,)
                )
            ]
            subject = resend_subject(resend, copy_id, stopped)
            insert_audit(connection, now, resend.by, "resend", subject, [*copies, *stopped])
            return copy_id

        copy_id: int | None = await self._write(job)
        if copy_id is None:
            raise NotFound(f"no event {resend.original_id}")
        return copy_id

    async def retry_now(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        def job(connection: sqlite3.Connection) -> VerbResult:
            row = connection.execute(RETRY_STATE, (delivery_id,)).fetchone()
            if row is None:
                return Missing()
            was, resume_status, next_attempt_at, target, order_key, resolved_by = row
            status = Status(was)
            step = retry_now_step(status, resume_status, next_attempt_at, order_key, resolved_by)
            if isinstance(step, NotApplicable):
                return step
            if step is RetryNow.WAITING_TURN:
                head = connection.execute(HEAD_OF_LINE, (target, order_key)).fetchone()
                held = HELD_BEHIND.from_row(head)
                return waiting_behind(held.delivery_id, held.status)
            if step is RetryNow.FROM_PENDING:
                connection.execute(RETRY_FROM_PENDING, (now, now, delivery_id))
            elif step is RetryNow.FROM_DEAD:
                connection.execute(RETRY_FROM_DEAD, (now, now, delivery_id))
            else:
                return delivery(connection, delivery_id)
            insert_log(connection, [delivery_id], now, "retry", retried(status), by)
            insert_audit(connection, now, by, "retry", f"delivery {delivery_id}", [delivery_id])
            return delivery(connection, delivery_id)

        return await self._delivery_verb(delivery_id, job)

    async def _delivery_verb(
        self, delivery_id: int, job: Callable[[sqlite3.Connection], VerbResult]
    ) -> DeliveryView:
        """Run an operator's verb on one delivery: the job answers its new view,
        Missing, or why the verb does not apply (relay.store.verbs)."""
        result: VerbResult = await self._write(job)
        return outcome(delivery_id, result)

    async def skip(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        def job(connection: sqlite3.Connection) -> VerbResult:
            row = connection.execute(
                "SELECT status FROM deliveries WHERE id = ?", (delivery_id,)
            ).fetchone()
            if row is None:
                return Missing()
            status = Status(*row)
            if (refused := may_skip(status)) is not None:
                return refused
            connection.execute(SKIP, (skipped_error(status), now, delivery_id))
            insert_log(connection, [delivery_id], now, "skip", skipped(status), by)
            insert_audit(connection, now, by, "skip", f"delivery {delivery_id}", [delivery_id])
            connection.execute(NEXT_IN_LINE, (now, now, delivery_id))
            return delivery(connection, delivery_id)

        return await self._delivery_verb(delivery_id, job)

    async def requeue(self, selection: Selection, now: float, *, by: str = UNKNOWN) -> list[int]:
        if selection.status not in REQUEUED:
            return []
        where, params = selection_where(selection, SQLITE)

        def job(connection: sqlite3.Connection) -> list[int]:
            ids = [
                delivery_id
                for (delivery_id,) in connection.execute(
                    # A delivered or skipped one sent again is a person's resend,
                    # outside its key's order (it would otherwise cut in line).
                    "UPDATE deliveries SET status = 'pending', cycle_attempts = 0, fails_alone = 0,"
                    " next_attempt_at = ?, lease_until = NULL, resume_status = NULL,"
                    " resume_at = NULL, updated_at = ?, order_key = CASE WHEN status"
                    " IN ('delivered', 'skipped') THEN NULL ELSE order_key END"
                    f" WHERE {where} RETURNING id",
                    [now, now, *params],
                ).fetchall()
            ]
            ids.sort()
            insert_log(connection, ids, now, "requeue", requeued(selection.status), by)
            insert_audit(connection, now, by, "requeue", describe_selection(selection), ids)
            return ids

        result: list[int] = await self._write(job)
        return result

    async def retry_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> RetriedNow:
        if selection.status not in RETRIED:
            return RetriedNow([])
        sendable = replace(selection, sendable=True)
        where, params = selection_where(sendable, SQLITE)

        def job(connection: sqlite3.Connection) -> RetriedNow | str:
            targets = connection.execute(SELECTED_TARGETS.format(where=where), params).fetchall()
            refused = sorted(name for name, paused_, _, _ in targets if paused_)
            if refused:
                return paused(refused)
            probed = sorted(name for name, _, down, _ in targets if down)
            for name in probed:
                connection.execute(PROBE_NOW, (now, name))
            ids = sorted(
                delivery_id
                for (delivery_id,) in connection.execute(
                    RETRY_SELECTED.format(where=where), [now, now, *params]
                ).fetchall()
            )
            insert_log(connection, ids, now, "retry", retried(selection.status), by)
            subject = describe_selection(sendable)
            insert_audit(connection, now, by, "retry", subject, ids)
            held = {name: until for name, _, _, until in targets if until and until > now}
            return RetriedNow(ids, probed, held)

        result: RetriedNow | str = await self._write(job)
        if isinstance(result, str):
            raise Conflict(result)
        return result

    async def skip_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> list[int]:
        if selection.status not in (Status.PENDING, Status.DEAD):
            return []
        where, params = selection_where(selection, SQLITE)

        def job(connection: sqlite3.Connection) -> list[int]:
            ids = [
                delivery_id
                for (delivery_id,) in connection.execute(
                    f"SELECT id FROM deliveries WHERE {where} ORDER BY id", params
                ).fetchall()
            ]
            was = selection.status.value
            for delivery_id in ids:
                connection.execute(SKIP, (skipped_error(was), now, delivery_id))
                # In id order: skipping the head of a key lets the next go,
                # unless it is skipped too, which lets the one after it go.
                connection.execute(NEXT_IN_LINE, (now, now, delivery_id))
            insert_log(connection, ids, now, "skip", skipped(was), by)
            insert_audit(connection, now, by, "skip", describe_selection(selection), ids)
            return ids

        result: list[int] = await self._write(job)
        return result

    async def set_paused(self, target: str, paused: bool, now: float, *, by: str = UNKNOWN) -> None:
        def job(connection: sqlite3.Connection) -> None:
            action = "pause" if paused else "resume"
            insert_audit(connection, now, by, action, f"target {target}")
            connection.execute(SET_PAUSED, (target, int(paused), now if paused else None))
            if not paused:
                connection.execute(PROBE_NOW, (now, target))

        await self._write(job)
