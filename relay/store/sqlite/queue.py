"""The SQLite store's queue: claims, leases and records of attempts."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping
from typing import Any

from relay.store.base import AttemptRecord, ClaimedDelivery, Decide, Step
from relay.store.dialect import SQLITE, placeholders
from relay.store.rows import (
    CLAIM_DUE,
    CLAIM_EXPIRED,
    EVENT_COLUMNS,
    FLAG_UNCONFIGURED,
    UNCONFIGURED,
    claimed_delivery,
    unconfigured,
)
from relay.store.sqlite.connection import SqliteConnection
from relay.store.sqlite.record import SqliteRecord


class SqliteQueue(SqliteConnection):
    # next_due reads the very conditions claim_due leases by.
    next_due_foresees_claims = True
    # One process: its scheduler's memory of the down state is the whole truth.
    claims_probes = False

    async def claim_due(
        self,
        now: float,
        lease_until: float,
        limits: Mapping[str, int],
        exclude: Collection[int] = (),
    ) -> list[ClaimedDelivery]:
        wanted = {target: limit for target, limit in limits.items() if limit > 0}
        if not wanted:
            return []
        skip = list(exclude)
        expired = CLAIM_EXPIRED.format(
            exclude=f"AND id NOT IN ({placeholders(len(skip))})" if skip else ""
        )

        def job(connection: sqlite3.Connection) -> list[ClaimedDelivery]:
            rows: list[Any] = []
            for target, limit in wanted.items():
                found = connection.execute(
                    expired, (lease_until, now, target, now, *skip, limit)
                ).fetchall()
                if len(found) < limit:
                    found += connection.execute(
                        CLAIM_DUE, (lease_until, now, target, now, limit - len(found))
                    ).fetchall()
                rows += found
            if not rows:
                return []
            event_ids = sorted({row[1] for row in rows})
            sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE id IN ({placeholders(len(event_ids))})"
            events = {row[0]: row for row in connection.execute(sql, event_ids)}
            return [claimed_delivery(row, events[row[1]]) for row in rows if row[1] in events]

        result: list[ClaimedDelivery] = await self._write(job)
        return result

    async def next_due(self, targets: Collection[str]) -> dict[str, float]:
        if not targets:
            return {}
        # One MIN per target and state: each is a single index probe, where a
        # MIN over `target IN (...)` would walk every pending row.
        parts = []
        params: list[Any] = []
        for target in targets:
            parts.append(
                "SELECT ? AS target, MIN(next_attempt_at) AS t FROM deliveries"
                " WHERE status = 'pending' AND target = ?"
            )
            parts.append(
                "SELECT ? AS target, MIN(lease_until) AS t FROM deliveries"
                " WHERE status = 'in_flight' AND target = ?"
            )
            params += [target, target, target, target]
        due: dict[str, float] = {}
        for target, moment in await self._read(" UNION ALL ".join(parts), params):
            if moment is not None:
                due[target] = min(float(moment), due.get(target, float("inf")))
        return due

    async def record_attempt(
        self,
        delivery: ClaimedDelivery,
        attempt: AttemptRecord,
        decide: Decide,
        now: float,
    ) -> Step:
        step: Step = await self._write(SqliteRecord(delivery, attempt, decide, now))
        return step

    async def release(self, delivery_ids: Collection[int], now: float) -> None:
        ids = list(delivery_ids)
        if not ids:
            return

        def job(connection: sqlite3.Connection) -> None:
            connection.execute(
                "UPDATE deliveries SET status = 'pending', lease_until = NULL, updated_at = ?"
                f" WHERE status = 'in_flight' AND id IN ({placeholders(len(ids))})",
                [now, *ids],
            )

        await self._write(job)

    async def recover_orphans(self, now: float) -> int:
        def job(connection: sqlite3.Connection) -> int:
            return connection.execute(
                # Each was an attempt interrupted: counted (rows.CLAIM_EXPIRED).
                "UPDATE deliveries SET status = 'pending', lease_until = NULL, updated_at = ?,"
                " attempts = attempts + 1 WHERE status = 'in_flight'",
                (now,),
            ).rowcount

        result: int = await self._write(job)
        return result

    async def flag_unconfigured(self, configured: Collection[str], now: float) -> dict[str, int]:
        sql, params = unconfigured(SQLITE, list(configured))

        def job(connection: sqlite3.Connection) -> dict[str, int]:
            counts: dict[str, int] = {}
            for target, count in connection.execute(sql, params).fetchall():
                counts[target] = count
                # In flight too: a lease given back unused keeps the note.
                why = UNCONFIGURED.format(target=target)
                connection.execute(FLAG_UNCONFIGURED, (why, now, target))
            return counts

        result: dict[str, int] = await self._write(job)
        return result
