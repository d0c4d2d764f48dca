"""The SQLite store: WAL, group-committed writes, reads on their own connection."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import aiosqlite
import orjson

from relay.store.base import (
    Accepted,
    AttemptRecord,
    AttemptView,
    ClaimedDelivery,
    Delivered,
    DeliveryView,
    EventDetail,
    EventQuery,
    EventView,
    Header,
    NewDelivery,
    NewEvent,
    RetryAt,
    Status,
    StoreError,
    StoreUnavailable,
    Transition,
)
from relay.store.migrations import LATEST, migrate
from relay.store.writer import GroupCommitWriter, unavailable

_EVENT_COLUMNS = (
    "id, route, idempotency_key, received_at, remote_addr, method, path, query, headers,"
    " content_type, body"
)
_DELIVERY_COLUMNS = (
    "id, event_id, target, status, attempts, cycle_attempts, next_attempt_at, last_error,"
    " updated_at"
)
_CLAIM_RETURNING = (
    "RETURNING id, event_id, route, target, attempts, cycle_attempts, resume_status, resume_at"
)
_CLAIM_DUE = f"""
UPDATE deliveries SET status = 'in_flight', lease_until = ?, updated_at = ?
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'pending' AND target = ? AND next_attempt_at <= ?
    ORDER BY next_attempt_at LIMIT ?)
{_CLAIM_RETURNING}
"""
_CLAIM_EXPIRED = f"""
UPDATE deliveries SET lease_until = ?, updated_at = ?
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'in_flight' AND target = ? AND lease_until <= ?
    ORDER BY lease_until LIMIT ?)
{_CLAIM_RETURNING}
"""


def _placeholders(count: int) -> str:
    return ",".join("?" * count)


class SqliteStore:
    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["full", "normal"] = "full",
        busy_timeout: float = 5.0,
        write_queue_timeout: float | None = None,
    ) -> None:
        self.path = path
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._write_queue_timeout = write_queue_timeout
        self._writer = GroupCommitWriter(self._connect_writer)
        self._reader: aiosqlite.Connection | None = None

    # Lifecycle

    async def open(self) -> None:
        try:
            await self._writer.start()
            self._reader = await aiosqlite.connect(self.path, isolation_level=None)
            await self._reader.execute("PRAGMA query_only = ON")
            await self._reader.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        except sqlite3.Error as error:
            await self.close()
            raise unavailable(error) from None

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.close()
            self._reader = None
        await self._writer.close()

    @property
    def write_stats(self) -> tuple[int, int]:
        """(transactions committed, jobs in them): the group commit's batching."""
        return self._writer.batches, self._writer.jobs

    def _connect_writer(self) -> sqlite3.Connection:
        if not self.path.exists():
            # Webhook bodies hold people's data: the file is ours alone.
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout
        )
        try:
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL mode (got {mode})")
            connection.execute(f"PRAGMA synchronous = {self._synchronous}")
            migrate(connection)
            version = connection.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]
            if version > LATEST:
                raise StoreError(
                    f"{self.path}: database schema is version {version}; "
                    f"this relay knows versions up to {LATEST} (upgrade relay)"
                )
        except BaseException:
            connection.close()
            raise
        return connection

    async def _write(self, job: Any, *, queue_timeout: float | None = None) -> Any:
        return await self._writer.run(job, queue_timeout=queue_timeout)

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        if self._reader is None:
            raise StoreUnavailable("store is not open")
        try:
            return list(await self._reader.execute_fetchall(sql, params))
        except sqlite3.Error as error:
            raise unavailable(error) from None

    # Ingress

    async def accept_event(
        self, event: NewEvent, deliveries: Sequence[NewDelivery], now: float
    ) -> Accepted:
        headers = orjson.dumps(event.headers)

        def job(connection: sqlite3.Connection) -> Accepted:
            values = (
                event.route,
                event.idempotency_key,
                event.received_at,
                event.remote_addr,
                event.method,
                event.path,
                event.query,
                headers,
                event.content_type,
                event.body,
            )
            if event.idempotency_key is None:
                cursor = connection.execute(
                    "INSERT INTO events (route, idempotency_key, received_at, remote_addr, method,"
                    " path, query, headers, content_type, body) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    values,
                )
                event_id = cursor.lastrowid
                assert event_id is not None
            else:
                rows = connection.execute(
                    "INSERT INTO events (route, idempotency_key, received_at, remote_addr, method,"
                    " path, query, headers, content_type, body) VALUES (?,?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT (idempotency_key, route) WHERE idempotency_key IS NOT NULL"
                    " DO NOTHING RETURNING id",
                    values,
                ).fetchall()
                if not rows:
                    existing = connection.execute(
                        "SELECT id FROM events WHERE idempotency_key = ? AND route = ?",
                        (event.idempotency_key, event.route),
                    ).fetchone()
                    return Accepted(existing[0], duplicate=True)
                event_id = rows[0][0]
            connection.executemany(
                "INSERT INTO deliveries (event_id, route, target, status, next_attempt_at,"
                " last_error, updated_at) VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        event_id,
                        event.route,
                        delivery.target,
                        delivery.status.value,
                        now if delivery.status is Status.PENDING else None,
                        delivery.reason,
                        now,
                    )
                    for delivery in deliveries
                ],
            )
            return Accepted(event_id, duplicate=False)

        result: Accepted = await self._write(job, queue_timeout=self._write_queue_timeout)
        return result

    # Scheduler

    async def claim_due(
        self, now: float, lease_until: float, limits: Mapping[str, int]
    ) -> list[ClaimedDelivery]:
        wanted = {target: limit for target, limit in limits.items() if limit > 0}
        if not wanted:
            return []

        def job(connection: sqlite3.Connection) -> list[ClaimedDelivery]:
            rows: list[Any] = []
            for target, limit in wanted.items():
                found = connection.execute(
                    _CLAIM_EXPIRED, (lease_until, now, target, now, limit)
                ).fetchall()
                if len(found) < limit:
                    found += connection.execute(
                        _CLAIM_DUE, (lease_until, now, target, now, limit - len(found))
                    ).fetchall()
                rows += found
            if not rows:
                return []
            event_ids = sorted({row[1] for row in rows})
            sql = (
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE id IN ({_placeholders(len(event_ids))})"
            )
            events = {row[0]: row for row in connection.execute(sql, event_ids)}
            return [_claimed(row, events[row[1]]) for row in rows if row[1] in events]

        result: list[ClaimedDelivery] = await self._write(job)
        return result

    async def next_due(self, targets: Collection[str]) -> float | None:
        if not targets:
            return None
        # One MIN per target and state: each is a single index probe, where a
        # MIN over `target IN (...)` would walk every pending row.
        parts = []
        params: list[Any] = []
        for target in targets:
            parts.append(
                "SELECT MIN(next_attempt_at) AS t FROM deliveries"
                " WHERE status = 'pending' AND target = ?"
            )
            parts.append(
                "SELECT MIN(lease_until) AS t FROM deliveries"
                " WHERE status = 'in_flight' AND target = ?"
            )
            params += [target, target]
        rows = await self._read(f"SELECT MIN(t) FROM ({' UNION ALL '.join(parts)})", params)
        value = rows[0][0]
        return float(value) if value is not None else None

    async def record_attempt(
        self, delivery: ClaimedDelivery, attempt: AttemptRecord, then: Transition, now: float
    ) -> None:
        # A manual attempt is one more try, not a step of the schedule.
        cycle = delivery.attempts_in_cycle + (0 if delivery.manual else 1)
        if isinstance(then, Delivered):
            status, next_at, error = Status.DELIVERED, None, None
        elif isinstance(then, RetryAt):
            status, next_at, error = Status.PENDING, then.at, attempt.error
        else:
            status, next_at, error = Status.DEAD, None, then.reason

        def job(connection: sqlite3.Connection) -> None:
            connection.execute(
                "INSERT INTO attempts (delivery_id, number, started_at, duration, outcome,"
                " http_status, error, response, next_attempt_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    delivery.id,
                    attempt.number,
                    attempt.started_at,
                    attempt.duration,
                    attempt.outcome,
                    attempt.http_status,
                    attempt.error,
                    attempt.response,
                    next_at,
                ),
            )
            connection.execute(
                "UPDATE deliveries SET status = ?, attempts = ?, cycle_attempts = ?,"
                " next_attempt_at = ?, lease_until = NULL, last_error = ?, updated_at = ?,"
                " resume_status = NULL, resume_at = NULL"
                " WHERE id = ? AND status = 'in_flight'",
                (status.value, attempt.number, cycle, next_at, error, now, delivery.id),
            )

        await self._write(job)

    async def release(self, delivery_ids: Collection[int], now: float) -> None:
        ids = list(delivery_ids)
        if not ids:
            return

        def job(connection: sqlite3.Connection) -> None:
            connection.execute(
                "UPDATE deliveries SET status = 'pending', lease_until = NULL, updated_at = ?"
                f" WHERE status = 'in_flight' AND id IN ({_placeholders(len(ids))})",
                [now, *ids],
            )

        await self._write(job)

    async def recover_orphans(self, now: float) -> int:
        def job(connection: sqlite3.Connection) -> int:
            return connection.execute(
                "UPDATE deliveries SET status = 'pending', lease_until = NULL, updated_at = ?"
                " WHERE status = 'in_flight'",
                (now,),
            ).rowcount

        result: int = await self._write(job)
        return result

    # Reading

    async def list_events(self, query: EventQuery) -> list[EventView]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("route = ?", query.route),
            ("received_at >= ?", query.since),
            ("received_at < ?", query.until),
            ("idempotency_key = ?", query.key),
            ("id < ?", query.before_id),
        ):
            if value is not None:
                where.append(column)
                params.append(value)
        if query.status is not None or query.target is not None:
            conditions = ["d.event_id = events.id"]
            if query.status is not None:
                conditions.append("d.status = ?")
                params.append(query.status.value)
            if query.target is not None:
                conditions.append("d.target = ?")
                params.append(query.target)
            where.append(f"EXISTS (SELECT 1 FROM deliveries d WHERE {' AND '.join(conditions)})")
        sql = "SELECT id, route, idempotency_key, received_at, remote_addr FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(query.limit)
        rows = await self._read(sql, params)
        deliveries = await self._deliveries_of([row[0] for row in rows])
        return [
            EventView(
                id=row[0],
                route=row[1],
                idempotency_key=row[2],
                received_at=row[3],
                remote_addr=row[4],
                deliveries=tuple(deliveries.get(row[0], ())),
            )
            for row in rows
        ]

    async def get_event(self, event_id: int) -> EventDetail | None:
        rows = await self._read(f"SELECT {_EVENT_COLUMNS} FROM events WHERE id = ?", (event_id,))
        if not rows:
            return None
        row = rows[0]
        deliveries = tuple((await self._deliveries_of([event_id])).get(event_id, ()))
        attempts: dict[int, list[AttemptView]] = {delivery.id: [] for delivery in deliveries}
        if deliveries:
            ids = [delivery.id for delivery in deliveries]
            for attempt in await self._read(
                "SELECT delivery_id, number, started_at, duration, outcome, http_status, error,"
                " response, next_attempt_at FROM attempts"
                f" WHERE delivery_id IN ({_placeholders(len(ids))}) ORDER BY id",
                ids,
            ):
                attempts[attempt[0]].append(
                    AttemptView(
                        delivery_id=attempt[0],
                        number=attempt[1],
                        started_at=attempt[2],
                        duration=attempt[3],
                        outcome=attempt[4],
                        http_status=attempt[5],
                        error=attempt[6],
                        response=bytes(attempt[7] or b""),
                        next_attempt_at=attempt[8],
                    )
                )
        return EventDetail(
            event=EventView(
                id=row[0],
                route=row[1],
                idempotency_key=row[2],
                received_at=row[3],
                remote_addr=row[4],
                deliveries=deliveries,
            ),
            method=row[5],
            path=row[6],
            query=row[7],
            headers=_headers(row[8]),
            content_type=row[9],
            body=bytes(row[10]),
            attempts={key: tuple(value) for key, value in attempts.items()},
        )

    async def _deliveries_of(self, event_ids: Iterable[int]) -> dict[int, list[DeliveryView]]:
        ids = list(event_ids)
        result: dict[int, list[DeliveryView]] = {}
        if not ids:
            return result
        rows = await self._read(
            f"SELECT {_DELIVERY_COLUMNS} FROM deliveries"
            f" WHERE event_id IN ({_placeholders(len(ids))}) ORDER BY id",
            ids,
        )
        for row in rows:
            result.setdefault(row[1], []).append(_delivery_view(row))
        return result


def _headers(raw: bytes) -> list[Header]:
    return [(str(name), str(value)) for name, value in orjson.loads(raw)]


def _delivery_view(row: Sequence[Any]) -> DeliveryView:
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
    )


def _claimed(delivery: Sequence[Any], event: Sequence[Any]) -> ClaimedDelivery:
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
        headers=_headers(event[8]),
        content_type=event[9],
        body=bytes(event[10]),
    )
