"""The SQLite store's queue: claims, leases and records of attempts."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping
from typing import Any

from relay.store.base import AttemptRecord, ClaimedDelivery, Decide, Recovered, Status, Step
from relay.store.columns import CLAIMED
from relay.store.dialect import SQLITE, placeholders
from relay.store.rows import (
    FLAG_UNCONFIGURED,
    PARKED,
    TAKEN_BACK,
    UNCONFIGURED,
    probe_choice,
    unconfigured,
)
from relay.store.sqlite.connection import SqliteConnection
from relay.store.sqlite.record import SqliteRecord
from relay.store.sqlite.supersede import stop_unfinished
from relay.store.supersede import COPY_FREE, COPY_FREE_HERE

# A corrected copy's delivery waits while what it stands in for is in flight
# (relay.store.supersede).
CLAIM_DUE = f"""
UPDATE deliveries SET status = 'in_flight', lease_until = ?, updated_at = ?
WHERE id IN (
    SELECT c.id FROM deliveries c
    WHERE c.status = 'pending' AND c.target = ? AND c.next_attempt_at <= ? AND {COPY_FREE}
    ORDER BY c.next_attempt_at, c.id LIMIT ?)
RETURNING id
"""
# A down target's one delivery, its probe (rows.probe_choice): (lease_until, now, target).
CLAIM_PROBE = f"""
UPDATE deliveries SET status = 'in_flight', lease_until = ?1, updated_at = ?2
WHERE id = {probe_choice("?3", "?2")} AND status = 'pending' AND {COPY_FREE_HERE}
RETURNING id
"""
# A lease taken over is an attempt interrupted (it may have reached the
# receiver): the next one carries the next number (X-Relay-Attempt), while
# the cycle's count, the retry budget, is not spent by relay's own crash.
# One a corrected copy waits for is never attempted again (recover_orphans
# ends it: one process, the serve lock's, holds every lease).
CLAIM_EXPIRED = """
UPDATE deliveries SET lease_until = ?, updated_at = ?, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM deliveries
    WHERE status = 'in_flight' AND target = ? AND lease_until <= ? {exclude}
    AND resolved_by IS NULL
    ORDER BY lease_until LIMIT ?)
RETURNING id
"""
# The earliest time a target has something to claim, read by the conditions
# claim_due leases by: (target, target) each.
NEXT_PENDING = f"""
SELECT ? AS target, (SELECT c.next_attempt_at FROM deliveries c
    WHERE c.status = 'pending' AND c.target = ? AND c.next_attempt_at IS NOT NULL
    AND {COPY_FREE} ORDER BY c.next_attempt_at LIMIT 1) AS t
"""
# The deliveries just claimed (d), each with its event (e).
CLAIMED_ROWS = (
    f"SELECT {CLAIMED.columns} FROM deliveries d JOIN events e ON e.id = d.event_id"
    " WHERE d.id IN ({ids})"
)


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
        probes: Collection[str] = (),
    ) -> list[ClaimedDelivery]:
        wanted = {target: limit for target, limit in limits.items() if limit > 0}
        if not wanted:
            return []
        skip = list(exclude)
        probing = frozenset(probes)
        expired = CLAIM_EXPIRED.format(
            exclude=f"AND id NOT IN ({placeholders(len(skip))})" if skip else ""
        )

        def job(connection: sqlite3.Connection) -> list[ClaimedDelivery]:
            ids: list[int] = []
            for target, limit in wanted.items():
                found = connection.execute(
                    expired, (lease_until, now, target, now, *skip, limit)
                ).fetchall()
                if len(found) < limit:
                    if target in probing:
                        found += connection.execute(
                            CLAIM_PROBE, (lease_until, now, target)
                        ).fetchall()
                    else:
                        found += connection.execute(
                            CLAIM_DUE, (lease_until, now, target, now, limit - len(found))
                        ).fetchall()
                ids += (delivery_id for (delivery_id,) in found)
            if not ids:
                return []
            sql = CLAIMED_ROWS.format(ids=placeholders(len(ids)))
            claimed = {c.id: c for c in map(CLAIMED.from_row, connection.execute(sql, ids))}
            return [claimed[delivery_id] for delivery_id in ids if delivery_id in claimed]

        result: list[ClaimedDelivery] = await self._write(job)
        return result

    async def next_due(self, targets: Collection[str]) -> dict[str, float]:
        if not targets:
            return {}
        # One first row per target and state: each is a single index probe,
        # where a MIN over `target IN (...)` would walk every pending row.
        parts = []
        params: list[Any] = []
        for target in targets:
            parts.append(NEXT_PENDING)
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

        among = f"id IN ({placeholders(len(ids))})"

        def job(connection: sqlite3.Connection) -> None:
            # Cut short, never recorded: one a corrected copy waits for ends
            # here, and the copy goes (relay.store.supersede).
            stop_unfinished(connection, among, ids, now, interrupted=False)
            connection.execute(
                "UPDATE deliveries SET status = 'pending', lease_until = NULL, updated_at = ?"
                f" WHERE status = 'in_flight' AND {among}",
                [now, *ids],
            )

        await self._write(job)

    async def recover_orphans(self, now: float) -> Recovered:
        def job(connection: sqlite3.Connection) -> Recovered:
            # One a corrected copy waits for ends here (relay.store.supersede);
            # each other was an attempt interrupted: counted (CLAIM_EXPIRED).
            stopped = stop_unfinished(connection, "1 = 1", (), now, interrupted=True)
            rows = connection.execute(
                f"UPDATE deliveries SET {TAKEN_BACK}, lease_until = NULL, updated_at = ?"
                " WHERE status = 'in_flight' RETURNING id, status",
                (PARKED, now),
            ).fetchall()
            parked = sorted(i for i, status in rows if status == Status.DEAD.value)
            return Recovered(stopped + len(rows), tuple(parked))

        result: Recovered = await self._write(job)
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
