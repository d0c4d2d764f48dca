"""The PostgreSQL store's queue: claims leased to this instance, records of attempts."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Collection, Mapping
from dataclasses import replace

import relay.store.rows as rows
from relay.store.base import (
    AttemptRecord,
    ClaimedDelivery,
    Decide,
    Recovered,
    Status,
    Step,
    StoreError,
    StoreUnavailable,
)
from relay.store.columns import CLAIMED
from relay.store.dialect import POSTGRES, numbered
from relay.store.postgres.cluster import (
    ALIVE,
    STARTED,
    allowed,
    beat_interval,
    heartbeats,
    lapsed,
    lease_expires,
    took,
)
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection
from relay.store.postgres.record import Record
from relay.store.postgres.supersede import stop_unfinished
from relay.store.postgres.writes import lock_lines
from relay.store.record import RecordJob
from relay.store.rows import PARKED, TAKEN_BACK, UNCONFIGURED, probe_choice, unconfigured
from relay.store.supersede import COPY_FREE, COPY_FREE_HERE

FLAG_UNCONFIGURED = numbered(rows.FLAG_UNCONFIGURED)  # (why, now, target)
# What a claim's updates return of each delivery: what CLAIMED reads of it (d).
CLAIM_RETURNING = f"RETURNING {CLAIMED.columns_on('d')}"


# A claim of one target, in one statement: first the leases that may be taken
# over (cluster.lapsed: its own expired by its clock; another's when that
# instance is gone, or by the server's clock), then what is due, up to $5 in
# all; each with its event. A lease taken over is an attempt interrupted,
# counted as on SQLite (sqlite.queue.CLAIM_EXPIRED); not one of this instance's claims
# whose answer was lost: nothing was sent for those. One a corrected copy
# waits for is never attempted again (claim_due ends it, STOP_LAPSED); the
# copy's delivery waits while it is in flight (relay.store.supersede).
CLAIM = f"""
WITH expired AS (
    UPDATE deliveries SET lease_until = $1, lease_owner = $2, updated_at = $3,
        lease_expires = {lease_expires("$3", "$1")},
        attempts = attempts + CASE WHEN (id, updated_at) IN
            (SELECT * FROM unnest($8::bigint[], $9::float8[])) THEN 0 ELSE 1 END
    WHERE id IN (
        SELECT id FROM deliveries
        WHERE status = 'in_flight' AND target = $4 AND id <> ALL($6::bigint[])
        AND resolved_by IS NULL
        AND {lapsed("$2", "$3", "$7", ("$8::bigint[]", "$9::float8[]"))}
        ORDER BY lease_until LIMIT $5
        FOR UPDATE SKIP LOCKED)
    {CLAIM_RETURNING}
), due AS (
    UPDATE deliveries SET status = 'in_flight', lease_until = $1, lease_owner = $2,
        updated_at = $3, lease_expires = {lease_expires("$3", "$1")}
    WHERE {{due}}
    {CLAIM_RETURNING}
)
SELECT {CLAIMED.columns}
FROM (SELECT * FROM expired UNION ALL SELECT * FROM due) AS d
JOIN events e ON e.id = d.event_id
ORDER BY d.id
"""
CLAIM_DUE = CLAIM.format(
    due=f"""id IN (
        SELECT c.id FROM deliveries c
        WHERE c.status = 'pending' AND c.target = $4 AND c.next_attempt_at <= $3
        AND {COPY_FREE}
        ORDER BY c.next_attempt_at, c.id LIMIT $5 - (SELECT COUNT(*) FROM expired)
        FOR UPDATE SKIP LOCKED)"""
)
# A down target's one delivery, its probe (rows.probe_choice); `allowed`
# gives it one claim at a time for the whole cluster (the target's claim
# lock), and the row is taken only if it is still pending.
CLAIM_PROBE = CLAIM.format(
    due=f"""id = {probe_choice("$4", "$3")} AND status = 'pending' AND {COPY_FREE_HERE}
        AND (SELECT COUNT(*) FROM expired) < $5"""
)


class PostgresQueue(PostgresConnection):
    # claim_due also takes over the leases of an instance whose heartbeats
    # stopped, before those leases run out: next_due does not read heartbeats.
    next_due_foresees_claims = False
    claims_probes = True

    async def claim_due(
        self,
        now: float,
        lease_until: float,
        limits: Mapping[str, int],
        exclude: Collection[int] = (),
        probes: Collection[str] = (),  # decided here, for the cluster (`allowed`)
    ) -> list[ClaimedDelivery]:
        wanted = {target: limit for target, limit in limits.items() if limit > 0}
        if not wanted:
            return []
        skip = list(exclude)
        self._unanswered_claims = {
            delivery_id: claim
            for delivery_id, claim in self._unanswered_claims.items()
            if claim[1] > now
        }
        unanswered = {delivery_id: at for delivery_id, (at, _) in self._unanswered_claims.items()}
        leased: list[int] = []  # by the job, once it ran to its end
        stale: list[int] = []

        async def job(connection: Connection) -> list[ClaimedDelivery]:
            if not self._claimed or self._unbeaten():
                # Alive with these leases, in their transaction, when the
                # heartbeats have not said so lately (not yet, or the database
                # was away): no other instance takes them for a gone one's.
                await connection.execute(ALIVE, self.instance_id, self.dead_after)
            claimed: list[ClaimedDelivery] = []
            counts: dict[str, int] = {}
            room, probing, lapsed_waited = await allowed(
                connection, wanted, self._limits, now, self.instance_id, self.dead_after, unanswered
            )
            stale[:] = lapsed_waited
            for target, limit in room.items():
                # A down target's one delivery is its probe, whatever the
                # instance last read of the target (cluster.allowed).
                probe = probing.get(target)
                found = await connection.fetch(
                    CLAIM_DUE if probe is None else CLAIM_PROBE,
                    lease_until,
                    self.instance_id,
                    now,
                    target,
                    limit,
                    skip,
                    self.dead_after,
                    list(unanswered),
                    list(unanswered.values()),
                )
                claimed += (
                    replace(CLAIMED.from_row(row), probe=probe)
                    if probe is not None
                    else CLAIMED.from_row(row)
                    for row in found
                )
                counts[target] = len(found)
            await took(connection, counts, self._limits, now)
            leased.extend(delivery.id for delivery in claimed)
            return claimed

        try:
            claimed = await self._write(job)
        except StoreError:
            for delivery_id in leased:
                self._unanswered_claims[delivery_id] = (now, lease_until)
            raise
        for delivery_id in leased:
            # Handed out: under way, the caller's (its `exclude` from now on).
            self._unanswered_claims.pop(delivery_id, None)
        self._claimed = True
        self._beat()
        if stale:
            # In a transaction of its own: it locks lines, which a claim,
            # holding the pacing and target rows, must not wait for.
            await self._stop_lapsed(stale, now)
        return claimed

    async def _stop_lapsed(self, delivery_ids: list[int], now: float) -> None:
        """Leases a corrected copy waits for whose instance is gone (or whose
        lease ran out): their attempt will never be recorded, they end as if it
        failed and the copies go at the next claim (relay.store.supersede)."""

        async def job(connection: Connection) -> int:
            await lock_lines(connection, delivery_ids)
            gone = lapsed("$4", "$1", "$5")
            return await stop_unfinished(
                connection,
                f"id = ANY($3::bigint[]) AND {gone}",
                [delivery_ids, self.instance_id, self.dead_after],
                now,
                interrupted=True,
            )

        await self._write(job)

    def _unbeaten(self) -> bool:
        """The heartbeats have not touched this instance's row for two of their
        turns, or never have."""
        last = self._beaten_at
        return last is None or time.monotonic() - last > 2 * beat_interval(self.dead_after)

    def _beaten(self) -> None:
        self._beaten_at = time.monotonic()

    def _beat(self) -> None:
        """Heartbeats from here on: once this store works the queue (recovers
        orphans at a start, or claims). A store that never does (an operator
        command) holds no lease another instance would wait for, and left a
        row in `instances` for ever, one per command."""
        if self._heartbeats is None and self._pool is not None:
            self._heartbeats = asyncio.create_task(
                heartbeats(
                    self.url, self.instance_id, self._command_timeout, self.dead_after, self._beaten
                ),
                name="relay-pg-heartbeat",
            )

    async def next_due(self, targets: Collection[str]) -> dict[str, float]:
        if not targets:
            return {}
        rows = await self._rows(
            "SELECT t, (SELECT c.next_attempt_at FROM deliveries c"
            "  WHERE c.status = 'pending' AND c.target = t AND c.next_attempt_at IS NOT NULL"
            f"  AND {COPY_FREE} ORDER BY c.next_attempt_at LIMIT 1),"
            " (SELECT MIN(lease_until) FROM deliveries WHERE status = 'in_flight' AND target = t)"
            " FROM unnest($1::text[]) AS t",
            list(targets),
        )
        due: dict[str, float] = {}
        for target, pending, leased in rows:
            moments = [float(m) for m in (pending, leased) if m is not None]
            if moments:
                due[target] = min(moments)
        return await self._paced(due)

    async def _paced(self, due: dict[str, float]) -> dict[str, float]:
        """Not before the cluster's pace lets the target send again (another
        instance may have taken the slot): the scheduler sleeps until then."""
        paces = {
            target: [name for name, _ in self._limits[target].paces]
            for target in due
            if target in self._limits and self._limits[target].paces
        }
        if not paces:
            return due
        names = sorted({name for names in paces.values() for name in names})
        next_at = {
            name: float(at)
            for name, at in await self._rows(
                "SELECT name, next_at FROM pacing WHERE name = ANY($1::text[])", names
            )
        }
        for target, names in paces.items():
            due[target] = max([due[target], *(next_at.get(name, 0.0) for name in names)])
        return due

    async def record_attempt(
        self,
        delivery: ClaimedDelivery,
        attempt: AttemptRecord,
        decide: Decide,
        now: float,
    ) -> Step:
        if self._records is None:
            raise StoreUnavailable("store is not open")
        job = RecordJob(delivery, attempt, decide, now)
        record = Record(job, self.instance_id, self._limits)
        record.first = self._unanswered_records.get(record.key)
        try:
            step = await self._records.submit(record)
        except StoreError:
            if record.answer is not None:  # its batch ran to its end: it may have committed
                self._unanswered_records[record.key] = record.answer
            raise
        self._unanswered_records.pop(record.key, None)
        return step

    async def release(self, delivery_ids: Collection[int], now: float) -> None:
        ids = list(delivery_ids)
        if not ids:
            return

        async def job(connection: Connection) -> None:
            # This instance's leases only: one taken over is another's attempt.
            # Cut short, never recorded: one a corrected copy waits for ends
            # here, and the copy goes (relay.store.supersede).
            await lock_lines(connection, ids)
            await stop_unfinished(
                connection,
                "id = ANY($3::bigint[]) AND lease_owner = $4",
                [ids, self.instance_id],
                now,
                interrupted=False,
            )
            await connection.execute(
                "UPDATE deliveries SET status = 'pending', lease_until = NULL,"
                " lease_owner = NULL, updated_at = $1"
                " WHERE status = 'in_flight' AND id = ANY($2::bigint[]) AND lease_owner = $3",
                now,
                ids,
                self.instance_id,
            )

        await self._write(job)

    async def recover_orphans(self, now: float) -> Recovered:
        """Give back this instance's own leases and every one that may be taken
        over; leases other live instances hold are theirs until they run out
        (by the server's clock)."""
        self._beat()  # `relay serve` starts here: it is one of the cluster now
        async with self._connection() as connection:
            await connection.execute(STARTED, self.instance_id, socket.gethostname())

        def given_back(me: str, dead_after: str) -> str:
            return f"(lease_owner = {me} OR {lapsed(me, '$1', dead_after)})"

        async def stop(connection: Connection) -> int:
            # One a corrected copy waits for ends here (relay.store.supersede).
            waited = [
                int(delivery_id)
                for (delivery_id,) in await connection.fetch(
                    "SELECT id FROM deliveries WHERE status = 'in_flight'"
                    f" AND resolved_by IS NOT NULL AND {given_back('$2', '$3')}",
                    now,
                    self.instance_id,
                    self.dead_after,
                )
            ]
            if not waited:
                return 0
            await lock_lines(connection, waited)
            return await stop_unfinished(
                connection,
                f"id = ANY($3::bigint[]) AND {given_back('$4', '$5')}",
                [waited, self.instance_id, self.dead_after],
                now,
                interrupted=True,
            )

        stopped = await self._write(stop)
        async with self._connection() as connection:
            rows = await connection.fetch(
                # Each was an attempt interrupted: counted (CLAIM); parked
                # after INTERRUPTED_LIMIT in a row, as on SQLite.
                f"UPDATE deliveries SET {TAKEN_BACK.replace('?', '$4')}, lease_until = NULL,"
                " lease_owner = NULL, lease_expires = NULL, updated_at = $1"
                f" WHERE status = 'in_flight' AND {given_back('$2', '$3')} RETURNING id, status",
                now,
                self.instance_id,
                self.dead_after,
                PARKED,
            )
        parked = sorted(i for i, status in rows if status == Status.DEAD.value)
        return Recovered(stopped + len(rows), tuple(parked))

    async def flag_unconfigured(self, configured: Collection[str], now: float) -> dict[str, int]:
        sql, params = unconfigured(POSTGRES, list(configured))

        async def job(connection: Connection) -> dict[str, int]:
            counts: dict[str, int] = {}
            for target, count in await connection.fetch(numbered(sql), *params):
                counts[target] = count
                # In flight too: a lease given back unused keeps the note.
                why = UNCONFIGURED.format(target=target)
                await connection.execute(FLAG_UNCONFIGURED, why, now, target)
            return counts

        return await self._write(job)
