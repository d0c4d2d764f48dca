"""The PostgreSQL store: many relay instances, one database (asyncpg).

The same contract as the SQLite store (relay/store/base.py), for N
instances on any hosts:
- intake is group-committed (relay/store/pg_intake.py); `synchronous_commit`
  on means the answer waits for the WAL flush, as SQLite's synchronous=FULL;
- deliveries are claimed with FOR UPDATE SKIP LOCKED and leased to this
  instance (`lease_owner`) until `lease_until`; an instance that dies loses
  its leases to the others once they expire, never before;
- `recover_orphans` gives back only what is this instance's own or expired:
  other instances' attempts under way are theirs;
- every state a person sets (pause) or relay learns (a target down) is a row
  all instances read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Hashable,
    Mapping,
    Sequence,
)
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import orjson

import relay.store.rows as rows
from relay.config import Config
from relay.core.pgurl import masked_url
from relay.store.accept import AcceptJob
from relay.store.base import (
    REJECTIONS_KEPT,
    SEARCH_SECONDS,
    UNKNOWN,
    Accepted,
    AlertNote,
    AttemptRecord,
    ClaimedDelivery,
    DeliveryView,
    FailureStreak,
    Hold,
    InstanceState,
    NewDelivery,
    NewEvent,
    NotFound,
    Rejection,
    Resend,
    SearchDocument,
    SearchTooSlow,
    Selection,
    Status,
    StoreError,
    StoreUnavailable,
    Transition,
    Waits,
)
from relay.store.dialect import POSTGRES, numbered
from relay.store.pg_batch import GroupCommit
from relay.store.pg_cluster import (
    ALIVE,
    DEAD_AFTER,
    INSTANCES,
    LEADER_LOCK,
    NAME_LOCK,
    SESSION_POOLING_NEEDED,
    STARTED,
    STOPPED,
    Leadership,
    TargetLimits,
    allowed,
    cluster_limits,
    heartbeats,
    lapsed,
    lease_expires,
    listen_forever,
    named,
    sessions_shared,
    took,
)
from relay.store.pg_errors import DRIVER_ERRORS, Connection, at, unavailable
from relay.store.pg_intake import store_batch
from relay.store.pg_record import NEXT_IN_LINE, Record, insert_log, record_batch
from relay.store.pg_schema import LATEST, migrate
from relay.store.reads import Fetch, Reads, purgeable, selection_where
from relay.store.record import RecordJob
from relay.store.rows import (
    DELIVERY_COLUMNS,
    EVENT_COLUMNS,
    claimed_delivery,
    copy_event,
    delivery_after,
    delivery_view,
    describe_selection,
    resend_subject,
)
from relay.store.verbs import (
    Missing,
    NotApplicable,
    RetryNow,
    VerbResult,
    may_skip,
    outcome,
    retry_now_step,
    waiting_behind,
)

T = TypeVar("T")

log = logging.getLogger("relay.store")

UNCONFIGURED = "target {target} is not configured: kept pending until it is"
# The channel instances wake each other on: new events and operator actions.
CHANNEL = "relay_wake"
# An instance gone this long without leases is left out of the list (rows of
# instances named by default, one per start, are not worth an operator's eye).
SHOWN_FOR = 86400.0
# New events wake the other instances at most this often (a wake-up is a
# hint: they poll too).
ANNOUNCE_SPACING = 0.05

CLAIM_RETURNING = rows.CLAIM_RETURNING
# A claim of one target, in one statement: first the leases that may be taken
# over (pg_cluster.lapsed: its own expired by its clock; another's when that
# instance is gone, or by the server's clock), then what is due, up to $5 in
# all; each with its event. A lease taken over is an attempt interrupted,
# counted as on SQLite (rows.CLAIM_EXPIRED); not one of this instance's claims
# whose answer was lost: nothing was sent for those.
CLAIM = f"""
WITH expired AS (
    UPDATE deliveries SET lease_until = $1, lease_owner = $2, updated_at = $3,
        lease_expires = {lease_expires("$3", "$1")},
        attempts = attempts + CASE WHEN (id, updated_at) IN
            (SELECT * FROM unnest($8::bigint[], $9::float8[])) THEN 0 ELSE 1 END
    WHERE id IN (
        SELECT id FROM deliveries
        WHERE status = 'in_flight' AND target = $4 AND id <> ALL($6::bigint[])
        AND {lapsed("$2", "$3", "$7", ("$8::bigint[]", "$9::float8[]"))}
        ORDER BY lease_until LIMIT $5
        FOR UPDATE SKIP LOCKED)
    {CLAIM_RETURNING}
), due AS (
    UPDATE deliveries SET status = 'in_flight', lease_until = $1, lease_owner = $2,
        updated_at = $3, lease_expires = {lease_expires("$3", "$1")}
    WHERE id IN (
        SELECT id FROM deliveries
        WHERE status = 'pending' AND target = $4 AND next_attempt_at <= $3
        ORDER BY next_attempt_at, id LIMIT $5 - (SELECT COUNT(*) FROM expired)
        FOR UPDATE SKIP LOCKED)
    {CLAIM_RETURNING}
)
SELECT c.*, {", ".join("e." + column.strip() for column in EVENT_COLUMNS.split(","))}
FROM (SELECT * FROM expired UNION ALL SELECT * FROM due) AS c
JOIN events e ON e.id = c.event_id
ORDER BY c.id
"""
# Columns of CLAIM_RETURNING: a claimed row's event columns follow them.
CLAIMED = len(CLAIM_RETURNING.removeprefix("RETURNING").split(","))

# The ordering lines' SQL is SQLite's, numbered (one text, one meaning).
HEAD_OF_LINE = numbered(rows.HEAD_OF_LINE)
LINK_COPY = numbered(rows.LINK_COPY)  # (original event, copy event)


class _AlreadySent(Exception):
    """Rolls back an alert whose notes another instance took first."""


def default_instance_id() -> str:
    """Host, process and a random part: unique even when a pid is reused."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class PostgresStore(Reads):
    dialect = POSTGRES
    # claim_due also takes over the leases of an instance whose heartbeats
    # stopped, before those leases run out: next_due does not read heartbeats.
    next_due_foresees_claims = False
    claims_probes = True

    def __init__(
        self,
        url: str,
        *,
        instance_id: str | None = None,
        min_connections: int = 2,
        max_connections: int = 10,
        command_timeout: float = 10.0,
        write_queue_timeout: float = 5.0,
        dead_after: float = DEAD_AFTER,
    ) -> None:
        self.url = url
        self.instance_id = instance_id or default_instance_id()
        self._min = min_connections
        self._max = max_connections
        self._command_timeout = command_timeout
        self._write_queue_timeout = write_queue_timeout
        self._pool: asyncpg.Pool | None = None
        self._commits_off_said = False  # the warning, once per store
        self._intake: GroupCommit[AcceptJob, Accepted] | None = None
        self._records: GroupCommit[Record, FailureStreak] | None = None
        self._announcing: asyncio.Task[None] | None = None
        self._announce_again = False
        self._started_at: float | None = None
        self._limits: dict[str, TargetLimits] = {}
        self._heartbeats: asyncio.Task[None] | None = None
        self._claimed = False  # this store leased deliveries (relay serve's, not a command's)
        # The deliveries each claim that failed once its transaction had run
        # leased, each with that claim's (now, lease_until): it may have
        # committed with its answer lost, leasing them to this instance while
        # no attempt here sends them. Until those leases run out, or a claim
        # hands them out, the next claims take them back (pg_cluster.lapsed).
        self._unanswered_claims: dict[int, tuple[float, float]] = {}
        # The answer of each record (delivery id, number, started_at) whose
        # transaction ran to its end and then failed: it may have committed
        # with its answer lost. The scheduler records it again; that record
        # is not kept twice, and answers what the first did (record_attempt).
        self._unanswered_records: dict[tuple[int, int, float], FailureStreak] = {}
        # Writes that must not be made twice (a resend, a requeue, alert
        # notes) whose COMMIT's answer was lost while the database could not
        # be asked what became of it: their transaction id and their answer,
        # by what was asked. The same request made again asks first
        # (_write_settled).
        self._unsettled: dict[Hashable, tuple[int, Any]] = {}
        # Seen silent this long, an instance is dead: its leases are taken over.
        self.dead_after = dead_after
        self._leadership = Leadership(url, command_timeout, dead_after, self.instance_id)
        # Every connection says whose it is (pg_stat_activity): relay/<instance>.
        self._named = named(url, self.instance_id)

    @property
    def path(self) -> str:
        """Where the data is, for messages (the URL without its password)."""
        return masked_url(self.url)

    # Lifecycle

    async def open(self) -> None:
        try:
            connection = await asyncpg.connect(
                self.url, timeout=self._command_timeout, server_settings=self._named
            )
            try:
                await migrate(connection)
                version = await connection.fetchval("SELECT MAX(version) FROM schema_migrations")
                commits = await connection.fetchval("SHOW synchronous_commit")
            finally:
                await connection.close()
            if version > LATEST:
                raise StoreError(
                    f"database schema is version {version}; "
                    f"this relay knows versions up to {LATEST} (upgrade relay)"
                )
            if commits == "off":
                self._say_commits_are_off()
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=self._min,
                max_size=self._max,
                command_timeout=self._command_timeout,
                timeout=self._command_timeout,
                connect=self._connect_synchronously,
                reset=_reset,
                server_settings=self._named,
            )
            async with self._pool.acquire() as first, self._pool.acquire() as second:
                if await sessions_shared(first, second):
                    raise StoreError(SESSION_POOLING_NEEDED)
        except (*DRIVER_ERRORS, StoreError) as error:
            await self.close()
            raise at(f"{self.path} (storage.url)", error) from None
        self._intake = GroupCommit(
            self._pool,
            store_batch,
            what="events",
            queue_timeout=self._write_queue_timeout,
            committed=self._announce,
        )
        self._intake.start("relay-pg-intake")
        self._records = GroupCommit(self._pool, record_batch, what="attempt records")
        self._records.start("relay-pg-records")

    async def _connect_synchronously(self, *args: Any, **kwargs: Any) -> Any:
        """Each of the pool's connections, made so that it commits synchronously.

        synchronous_commit off (for the role or the database, or on a server
        failed over to, or restarted with it) would answer a 200 before the
        event is on disk. It is read on every new connection, not once at
        start; a connection that finds it off is made again with it on as a
        startup setting (a SET would not outlive the pool's RESET ALL). Any
        other level keeps the operator's.
        """
        connection = await asyncpg.connect(*args, **kwargs)
        try:
            level = await connection.fetchval("SHOW synchronous_commit")
        except BaseException:
            connection.terminate()
            raise
        if level != "off":
            return connection
        await connection.close()
        self._say_commits_are_off()
        settings = {**(kwargs.pop("server_settings", None) or {}), "synchronous_commit": "on"}
        return await asyncpg.connect(*args, server_settings=settings, **kwargs)

    def _say_commits_are_off(self) -> None:
        if self._commits_off_said:
            return
        self._commits_off_said = True
        log.warning(
            "%s: the database says synchronous_commit = off; relay commits"
            " synchronously all the same (set it on for relay's role)",
            self.path,
        )

    def set_limits(self, limits: Mapping[str, TargetLimits]) -> None:
        """Targets' concurrency and rates as totals for the whole cluster
        (relay.store.pg_cluster.cluster_limits of the config in force)."""
        self._limits = dict(limits)

    def reconfigure(self, config: Config) -> None:
        """The config's target limits, as totals for the whole cluster."""
        self.set_limits(cluster_limits(config))

    async def lead(self) -> bool:
        """Whether this instance runs the singletons (retention, alert grouping,
        gauges) now; takes the lead when it is free. One caller at a time."""
        return await self._leadership.lead()

    # Alerts: every instance notes, the leading one groups and sends.

    async def note_alerts(self, notes: Sequence[bytes], now: float) -> None:
        async def job(connection: Connection) -> None:
            await connection.execute(
                "INSERT INTO alert_notes (noted_at, note) SELECT $1, n FROM unnest($2::bytea[]) n",
                now,
                list(notes),
            )

        # Noted twice, a note may be said in two alerts (the leader sending
        # between the two).
        await self._write_settled(job, ("notes", tuple(notes)))

    async def alert_notes(self) -> list[AlertNote]:
        rows = await self._rows("SELECT id, noted_at, note FROM alert_notes ORDER BY id")
        return [AlertNote(row[0], row[1], bytes(row[2])) for row in rows]

    async def send_alert(
        self,
        notes: Collection[int],
        event: NewEvent | None,
        deliveries: Sequence[NewDelivery],
        now: float,
    ) -> Accepted | None:
        ids = sorted(notes)

        async def job(connection: Connection) -> Accepted | None:
            taken = await connection.fetchval(
                "WITH taken AS (DELETE FROM alert_notes WHERE id = ANY($1::bigint[]) RETURNING 1)"
                " SELECT COUNT(*) FROM taken",
                ids,
            )
            if taken != len(ids):
                # Sent (in part) by another instance that thought it led: say nothing.
                raise _AlreadySent
            if event is None:
                return None
            [accepted] = await store_batch(connection, [AcceptJob(event, deliveries, now)])
            await connection.execute("SELECT pg_notify($1, 'event')", CHANNEL)
            return accepted

        try:
            return await self._write(job)
        except _AlreadySent:
            return None

    async def listen(self, callback: Callable[[str], None]) -> None:
        """Call `callback` with every wake-up any instance sends, until cancelled."""
        await listen_forever(self.url, CHANNEL, callback, self.instance_id)

    async def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
            self._heartbeats = None
        await self._leadership.close()
        for batches in (self._intake, self._records):
            if batches is not None:
                await batches.close()
        self._intake = self._records = None
        if self._announcing is not None:
            self._announcing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._announcing
            self._announcing = None
        if self._pool is not None:
            if self._claimed:
                # Stopped: any lease left (not given back) is free for the others now.
                with contextlib.suppress(*DRIVER_ERRORS):
                    await self._pool.execute(STOPPED, self.instance_id)
                self._claimed = False
            await self._pool.close()
            self._pool = None

    @property
    def write_stats(self) -> tuple[int, int]:
        """(transactions committed, events in them): the group commit's batching."""
        if self._intake is None:
            return 0, 0
        return self._intake.batches, self._intake.jobs

    def file_problem(self) -> str | None:
        return None  # no file: the server's own health is what heartbeat() checks

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        if self._pool is None:
            raise StoreUnavailable("store is not open")
        try:
            async with self._pool.acquire() as connection:
                try:
                    yield connection
                except asyncpg.exceptions.InternalClientError:
                    # Its protocol state is unknown: never lend it out again.
                    connection.terminate()
                    raise
        except DRIVER_ERRORS as error:
            raise unavailable(error) from None

    async def _write(self, job: Callable[[Connection], Awaitable[T]]) -> T:
        """One transaction: `job` runs in it and its result is returned after the commit."""
        async with self._connection() as connection, connection.transaction():
            return await job(connection)

    async def _write_settled(self, job: Callable[[Connection], Awaitable[T]], asked: Hashable) -> T:
        """As _write, for a write that made twice is applied twice (a person's
        resend or requeue, an alert note): when the connection breaks with
        its COMMIT sent, the server is asked whether that transaction
        committed (txid_status) and, if it did, its answer is returned.

        When the server cannot be asked now, the error is raised and the
        transaction remembered by `asked`: the same request made again (the
        person presses again, the alerter stores the same notes again) asks
        first, and answers what the first one did if it committed."""
        unsettled = self._unsettled.get(asked)
        if unsettled is not None:
            txid, answer = unsettled
            # Raises while the database cannot be asked. One that answers but
            # cannot tell (the transaction too old for it, or unknown to a
            # server failed over to) is asked anew: nothing else would ever be.
            try:
                committed = await self._committed(txid, forgotten=True)
            except StoreUnavailable:
                raise
            except StoreError:
                committed = False
            # Another caller of the same request may have settled it meanwhile
            # (or failed anew, with a transaction of its own to remember).
            if self._unsettled.get(asked) is unsettled:
                del self._unsettled[asked]
            if committed:
                result: T = answer
                return result
        ran: list[tuple[int, T]] = []  # once the job ran to its end

        async def settled(connection: Connection) -> T:
            result = await job(connection)
            ran.append((await connection.fetchval("SELECT txid_current()"), result))
            return result

        try:
            return await self._write(settled)
        except StoreError:
            if not ran:
                raise
            txid, answer = ran[-1]
            try:
                committed = await self._committed(txid)
            except StoreError:
                self._unsettled[asked] = (txid, answer)
                raise
            if committed:
                return answer
            raise

    async def _committed(self, txid: int, *, forgotten: bool = False) -> bool:
        """Whether transaction `txid` committed: waits while it is still in
        progress (its COMMIT on its way), for at most the command timeout.
        One the server no longer knows (NULL) is `forgotten`, or unknown."""
        status = None
        try:
            # The whole wait: a poll whose connection or query hangs must not
            # run past it (each has the command timeout of its own).
            async with asyncio.timeout(self._command_timeout):
                while True:
                    async with self._connection() as connection:
                        status = await connection.fetchval("SELECT txid_status($1)", txid)
                    if status in ("committed", "aborted"):
                        return bool(status == "committed")
                    if status is None:
                        if forgotten:
                            return False
                        break
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pass
        raise StoreUnavailable(
            f"the database cannot say whether transaction {txid} committed ({status})"
        )

    async def _rows(self, sql: str, *params: Any) -> list[asyncpg.Record]:
        async with self._connection() as connection:
            rows: list[asyncpg.Record] = await connection.fetch(sql, *params)
            return rows

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Connection]:
        """Several reads that must agree: one read-only repeatable-read transaction."""
        async with (
            self._connection() as connection,
            connection.transaction(isolation="repeatable_read", readonly=True),
        ):
            yield connection

    async def _read(
        self, sql: str, params: Sequence[Any] = (), *, slow: bool = False
    ) -> list[asyncpg.Record]:
        return await self._rows(numbered(sql), *params)

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[Fetch]:
        async with self._snapshot() as connection:

            async def fetch(sql: str, params: Sequence[Any] = (), /) -> list[asyncpg.Record]:
                rows: list[asyncpg.Record] = await connection.fetch(numbered(sql), *params)
                return rows

            yield fetch

    async def _search(self, sql: str, params: Sequence[Any]) -> list[asyncpg.Record]:
        """A search's statement, stopped at SEARCH_SECONDS (in its transaction only)."""
        async with self._snapshot() as connection:
            await connection.execute(f"SET LOCAL statement_timeout = {int(SEARCH_SECONDS * 1000)}")
            try:
                rows: list[asyncpg.Record] = await connection.fetch(numbered(sql), *params)
            except asyncpg.exceptions.QueryCanceledError:
                raise SearchTooSlow from None
            return rows

    async def notify(self, what: str) -> None:
        """Wake every instance's scheduler (an operator action, a new event)."""
        async with self._connection() as connection:
            await connection.execute("SELECT pg_notify($1, $2)", CHANNEL, what)

    # Ingress

    def accept_event(
        self,
        event: NewEvent,
        deliveries: Sequence[NewDelivery],
        now: float,
        *,
        refuse_conflict: bool = False,
        from_sender: bool = True,
    ) -> asyncio.Future[Accepted]:
        # (No file to lose: file_problem() is always None here.)
        if self._intake is None:
            raise StoreUnavailable("store is not open")
        return self._intake.submit(AcceptJob(event, deliveries, now, refuse_conflict))

    # Scheduler

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
        self._unanswered_claims = {
            delivery_id: claim
            for delivery_id, claim in self._unanswered_claims.items()
            if claim[1] > now
        }
        unanswered = {delivery_id: at for delivery_id, (at, _) in self._unanswered_claims.items()}
        leased: list[int] = []  # by the job, once it ran to its end

        async def job(connection: Connection) -> list[ClaimedDelivery]:
            if not self._claimed:
                # Alive with its first lease (the heartbeats may not have spoken
                # yet): no other instance takes it for an unknown owner's.
                await connection.execute(ALIVE, self.instance_id)
            claimed: list[ClaimedDelivery] = []
            counts: dict[str, int] = {}
            room, probing = await allowed(
                connection, wanted, self._limits, now, self.instance_id, self.dead_after, unanswered
            )
            for target, limit in room.items():
                found = await connection.fetch(
                    CLAIM,
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
                # A down target's one delivery is its probe, whatever the
                # instance last read of the target (pg_cluster.allowed).
                claimed += (
                    replace(
                        claimed_delivery(tuple(row[:CLAIMED]), tuple(row[CLAIMED:])),
                        probe=probing.get(target),
                    )
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
        return claimed

    def _beat(self) -> None:
        """Heartbeats from here on: once this store works the queue (recovers
        orphans at a start, or claims). A store that never does (an operator
        command) holds no lease another instance would wait for, and left a
        row in `instances` for ever, one per command."""
        if self._heartbeats is None and self._pool is not None:
            self._heartbeats = asyncio.create_task(
                heartbeats(self.url, self.instance_id, self._command_timeout, self.dead_after / 5),
                name="relay-pg-heartbeat",
            )

    async def next_due(self, targets: Collection[str]) -> dict[str, float]:
        if not targets:
            return {}
        rows = await self._rows(
            "SELECT t, (SELECT MIN(next_attempt_at) FROM deliveries"
            "  WHERE status = 'pending' AND target = t),"
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
            row[0]: float(row[1])
            for row in await self._rows(
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
        then: Transition,
        now: float,
        hold: Hold | None = None,
    ) -> FailureStreak:
        if self._records is None:
            raise StoreUnavailable("store is not open")
        waits = isinstance(then, Waits)
        cycle = delivery.attempts_in_cycle + (1 if attempt.in_cycle else 0)
        status, next_at, error = delivery_after(then, attempt)
        job = RecordJob(delivery, attempt, status, next_at, error, waits, cycle, now, hold)
        record = Record(job, then, self.instance_id, self._limits)
        record.first = self._unanswered_records.get(record.key)
        try:
            streak = await self._records.submit(record)
        except StoreError:
            if record.answer is not None:  # its batch ran to its end: it may have committed
                self._unanswered_records[record.key] = record.answer
            raise
        self._unanswered_records.pop(record.key, None)
        return streak

    async def release(self, delivery_ids: Collection[int], now: float) -> None:
        ids = list(delivery_ids)
        if not ids:
            return
        async with self._connection() as connection:
            # This instance's leases only: one taken over is another's attempt.
            await connection.execute(
                "UPDATE deliveries SET status = 'pending', lease_until = NULL,"
                " lease_owner = NULL, updated_at = $1"
                " WHERE status = 'in_flight' AND id = ANY($2::bigint[]) AND lease_owner = $3",
                now,
                ids,
                self.instance_id,
            )

    async def recover_orphans(self, now: float) -> int:
        """Give back this instance's own leases and every one that may be taken
        over; leases other live instances hold are theirs until they run out
        (by the server's clock)."""
        self._beat()  # `relay serve` starts here: it is one of the cluster now
        async with self._connection() as connection:
            await connection.execute(STARTED, self.instance_id, socket.gethostname())
            result = await connection.execute(
                # Each was an attempt interrupted: counted (CLAIM).
                "UPDATE deliveries SET status = 'pending', lease_until = NULL,"
                " lease_owner = NULL, lease_expires = NULL, updated_at = $1,"
                " attempts = attempts + 1"
                " WHERE status = 'in_flight' AND (lease_owner = $2"
                f" OR {lapsed('$2', '$1', '$3')})",
                now,
                self.instance_id,
                self.dead_after,
            )
        return int(result.split()[-1])

    # Reading

    async def index_events(self, documents: Sequence[SearchDocument], through: int) -> None:
        async def job(connection: Connection) -> None:
            if documents:
                await connection.execute(
                    "INSERT INTO event_search (event_id, text, digits)"
                    " SELECT d.id, d.text, d.digits"
                    " FROM unnest($1::bigint[], $2::text[], $3::text[]) AS d(id, text, digits)"
                    " WHERE EXISTS (SELECT 1 FROM events WHERE events.id = d.id)"
                    " ON CONFLICT (event_id) DO UPDATE SET text = excluded.text,"
                    " digits = excluded.digits",
                    [doc.event_id for doc in documents],
                    [_text(doc.text) for doc in documents],
                    [_text(doc.digits) for doc in documents],
                )
            await connection.execute(
                "UPDATE search_progress SET indexed_through = GREATEST(indexed_through, $1)"
                " WHERE id = 1",
                through,
            )

        await self._write(job)

    # Operator verbs

    async def resend(self, resend: Resend, now: float) -> int:
        async def job(connection: Connection) -> int | None:
            row = await connection.fetchrow(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE id = $1", resend.original_id
            )
            if row is None:
                return None
            event = copy_event(row, resend, now)
            deliveries = [NewDelivery(target) for target in resend.targets]
            [accepted] = await store_batch(connection, [AcceptJob(event, deliveries, now)])
            await connection.execute(
                "INSERT INTO resends (copy_id, original_id, at, by) VALUES ($1, $2, $3, $4)",
                accepted.event_id,
                resend.original_id,
                now,
                resend.by,
            )
            await connection.execute(LINK_COPY, resend.original_id, accepted.event_id)
            copies = [
                int(row[0])
                for row in await connection.fetch(
                    "SELECT id FROM deliveries WHERE event_id = $1 ORDER BY id", accepted.event_id
                )
            ]
            subject = resend_subject(resend, accepted.event_id)
            await _insert_audit(connection, now, resend.by, "resend", subject, copies)
            return accepted.event_id

        # Made twice, a resend is two copies: two orders in the CRM.
        copy_id = await self._write_settled(job, ("resend", resend))
        if copy_id is None:
            raise NotFound(f"no event {resend.original_id}")
        await self._wake("resend")
        return copy_id

    async def retry_now(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        async def job(connection: Connection) -> VerbResult:
            row = await connection.fetchrow(
                "SELECT status, resume_status, next_attempt_at, target, order_key"
                " FROM deliveries WHERE id = $1 FOR UPDATE",
                delivery_id,
            )
            if row is None:
                return Missing()
            status = Status(row[0])
            step = retry_now_step(status, row[1], row[2], row[4])
            if isinstance(step, NotApplicable):
                return step
            if step is RetryNow.WAITING_TURN:
                head = await connection.fetchrow(HEAD_OF_LINE, row[3], row[4])
                assert head is not None  # it is in its line, so the line has a head
                return waiting_behind(head[0], head[1])
            if step is RetryNow.FROM_PENDING:
                await connection.execute(
                    "UPDATE deliveries SET resume_status = 'pending',"
                    " resume_at = next_attempt_at, next_attempt_at = $1, updated_at = $1"
                    " WHERE id = $2",
                    now,
                    delivery_id,
                )
            elif step is RetryNow.FROM_DEAD:
                await connection.execute(
                    "UPDATE deliveries SET status = 'pending', resume_status = 'dead',"
                    " resume_at = NULL, next_attempt_at = $1, updated_at = $1 WHERE id = $2",
                    now,
                    delivery_id,
                )
            else:
                return await _select_delivery(connection, delivery_id)
            await insert_log(
                connection,
                [delivery_id],
                now,
                "retry",
                f"one more attempt (was {status.value})",
                by,
            )
            await _insert_audit(
                connection, now, by, "retry", f"delivery {delivery_id}", [delivery_id]
            )
            return await _select_delivery(connection, delivery_id)

        result = outcome(delivery_id, await self._write(job))
        await self._wake("retry")
        return result

    async def skip(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        async def job(connection: Connection) -> VerbResult:
            status_text = await connection.fetchval(
                "SELECT status FROM deliveries WHERE id = $1 FOR UPDATE", delivery_id
            )
            if status_text is None:
                return Missing()
            status = Status(status_text)
            if (refused := may_skip(status)) is not None:
                return refused
            await connection.execute(
                "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL,"
                " resume_status = NULL, resume_at = NULL, last_error = $1, updated_at = $2"
                " WHERE id = $3",
                f"skipped by an operator (was {status.value})",
                now,
                delivery_id,
            )
            await insert_log(
                connection,
                [delivery_id],
                now,
                "skip",
                f"not to be sent (was {status.value})",
                by,
            )
            await _insert_audit(
                connection, now, by, "skip", f"delivery {delivery_id}", [delivery_id]
            )
            await connection.execute(NEXT_IN_LINE, now, now, delivery_id)
            return await _select_delivery(connection, delivery_id)

        result = outcome(delivery_id, await self._write(job))
        await self._wake("skip")
        return result

    async def requeue(self, selection: Selection, now: float, *, by: str = UNKNOWN) -> list[int]:
        if selection.status in (Status.PENDING, Status.IN_FLIGHT):
            return []
        where, params = selection_where(selection, POSTGRES)

        async def job(connection: Connection) -> list[int]:
            ids = [
                row[0]
                for row in await connection.fetch(
                    # A delivered or skipped one sent again is a person's resend,
                    # outside its key's order (it would otherwise cut in line).
                    "UPDATE deliveries SET status = 'pending', cycle_attempts = 0,"
                    " fails_alone = false, next_attempt_at = $1, lease_until = NULL,"
                    " lease_owner = NULL,"
                    " resume_status = NULL, resume_at = NULL, updated_at = $1,"
                    " order_key = CASE WHEN status IN ('delivered', 'skipped', 'resolved')"
                    " THEN NULL ELSE order_key END"
                    f" WHERE {numbered(where, 2)} RETURNING id",
                    now,
                    *params,
                )
            ]
            ids.sort()
            await insert_log(
                connection, ids, now, "requeue", f"fresh retry cycle (was {selection.status})", by
            )
            subject = describe_selection(selection)
            await _insert_audit(connection, now, by, "requeue", subject, ids)
            return ids

        # Made twice, a requeue of delivered deliveries sends them twice more.
        ids = await self._write_settled(job, ("requeue", selection))
        if ids:
            await self._wake("requeue")
        return ids

    async def skip_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> list[int]:
        if selection.status not in (Status.PENDING, Status.DEAD):
            return []
        where, params = selection_where(selection, POSTGRES)
        was = selection.status.value

        async def job(connection: Connection) -> list[int]:
            # Locked, in id order: an attempt's record or another skip waits.
            ids = [
                int(row[0])
                for row in await connection.fetch(
                    f"SELECT id FROM deliveries WHERE {numbered(where)} ORDER BY id FOR UPDATE",
                    *params,
                )
            ]
            for delivery_id in ids:
                await connection.execute(
                    "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL,"
                    " resume_status = NULL, resume_at = NULL, last_error = $1, updated_at = $2"
                    " WHERE id = $3",
                    f"skipped by an operator (was {was})",
                    now,
                    delivery_id,
                )
                await connection.execute(NEXT_IN_LINE, now, now, delivery_id)
            await insert_log(connection, ids, now, "skip", f"not to be sent (was {was})", by)
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
            await connection.execute(
                "INSERT INTO targets (name, paused, paused_at) VALUES ($1, $2, $3)"
                " ON CONFLICT (name) DO UPDATE SET paused = excluded.paused,"
                " paused_at = excluded.paused_at",
                target,
                paused,
                now if paused else None,
            )
            if not paused:
                # A person resuming a down target wants to know now: probe at once.
                await connection.execute(
                    "UPDATE targets SET probe_at = LEAST(probe_at, $1)"
                    " WHERE name = $2 AND down_since IS NOT NULL",
                    now,
                    target,
                )

        await self._write(job)
        await self._wake("pause")

    async def purge(
        self, cutoffs: Mapping[str, float], default_cutoff: float, *, limit: int, dry_run: bool
    ) -> int:
        if dry_run:
            return await self._purgeable(cutoffs, default_cutoff)
        where, params = purgeable(POSTGRES, cutoffs, default_cutoff)

        async def job(connection: Connection) -> int:
            event_ids = [
                row[0]
                for row in await connection.fetch(
                    numbered(
                        f"SELECT id FROM events WHERE {where}"
                        " ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED"
                    ),
                    *params,
                    limit,
                )
            ]
            if not event_ids:
                return 0
            delivery_ids = [
                row[0]
                for row in await connection.fetch(
                    "SELECT id FROM deliveries WHERE event_id = ANY($1::bigint[])", event_ids
                )
            ]
            for table, column, ids in (
                ("attempts", "delivery_id", delivery_ids),
                ("delivery_log", "delivery_id", delivery_ids),
                ("deliveries", "id", delivery_ids),
                ("event_search", "event_id", event_ids),
                ("events", "id", event_ids),
            ):
                await connection.execute(
                    f"DELETE FROM {table} WHERE {column} = ANY($1::bigint[])", ids
                )
            return len(event_ids)

        return await self._write(job)

    async def flag_unconfigured(self, configured: Collection[str], now: float) -> dict[str, int]:
        names = list(configured)

        async def job(connection: Connection) -> dict[str, int]:
            counts: dict[str, int] = {}
            for target, count in await connection.fetch(
                "SELECT target, COUNT(*) FROM deliveries WHERE status IN ('pending', 'in_flight')"
                " AND target <> ALL($1::text[]) GROUP BY target",
                names,
            ):
                counts[target] = count
                await connection.execute(
                    "UPDATE deliveries SET last_error = $1, updated_at = $2"
                    " WHERE status IN ('pending', 'in_flight') AND target = $3",
                    UNCONFIGURED.format(target=target),
                    now,
                    target,
                )
            return counts

        return await self._write(job)

    async def record_rejection(self, rejection: Rejection) -> None:
        async def job(connection: Connection) -> None:
            await connection.execute(
                "INSERT INTO rejections (route, at, remote_addr, reason, detail, headers)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                rejection.route,
                rejection.at,
                rejection.remote_addr,
                rejection.reason,
                rejection.detail,
                orjson.dumps(rejection.headers),
            )
            await connection.execute(
                "DELETE FROM rejections WHERE route = $1 AND id <= (SELECT id FROM rejections"
                " WHERE route = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)",
                rejection.route,
                REJECTIONS_KEPT,
            )

        await self._write(job)

    async def backup(self, destination: Path) -> int:
        raise StoreError(
            "relay backup copies a SQLite file; on PostgreSQL use pg_dump"
            f" (pg_dump --format=custom --file={destination} DATABASE), see docs/postgres.md"
        )

    async def heartbeat(self, now: float) -> None:
        """This instance is alive and the database takes a durable write."""
        if self._started_at is None:
            self._started_at = now
        async with self._connection() as connection:
            await connection.execute(
                "INSERT INTO instances (id, started_at, seen_at) VALUES ($1, $2, $3)"
                " ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at",
                self.instance_id,
                self._started_at,
                now,
            )

    async def instances(self) -> list[InstanceState]:
        rows = await self._rows(
            INSTANCES,
            LEADER_LOCK >> 32,
            LEADER_LOCK & 0xFFFFFFFF,
            NAME_LOCK,
            self.dead_after,
            SHOWN_FOR,
        )
        return [
            InstanceState(
                id=row["id"],
                host=row["host"],
                started_at=row["started_at"],
                last_heartbeat=row["beat"],
                heartbeat_age=None if row["beat"] is None else max(0.0, row["now"] - row["beat"]),
                state=row["state"],
                leases=row["leases"],
                leader=row["leader"],
            )
            for row in rows
        ]

    async def reclaim_space(self) -> int:
        return 0  # autovacuum gives freed space back to the table

    async def release_memory(self) -> None:
        pass  # the server holds the caches; the pool's connections keep little

    async def server_settings(self) -> dict[str, str]:
        """The server's durability settings, for `relay check`."""
        rows = await self._rows(
            "SELECT name, setting FROM pg_settings"
            " WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')"
        )
        return {row[0]: row[1] for row in rows}

    def _announce(self) -> None:
        """New events committed: wake the other instances, outside the intake's
        transaction and at most once an ANNOUNCE_SPACING. A NOTIFY in that
        transaction held PostgreSQL's one notification lock through the commit,
        so every instance's intake committed in turn; and this instance's own
        scheduler is woken in-process (App._accepted)."""
        if self._announcing is not None and not self._announcing.done():
            self._announce_again = True
            return
        self._announcing = asyncio.create_task(self._announcements(), name="relay-pg-announce")

    async def _announcements(self) -> None:
        while True:
            self._announce_again = False
            await self._wake("event")
            await asyncio.sleep(ANNOUNCE_SPACING)
            if not self._announce_again:
                return

    async def _wake(self, what: str) -> None:
        # A wake-up is a hint (instances poll too): a lost one costs a poll interval.
        with contextlib.suppress(StoreError):
            await self.notify(what)


async def _reset(connection: asyncpg.Connection) -> None:
    """A connection given back to the pool: asyncpg has already rolled back a
    transaction left open. Nothing else to undo: relay keeps no session state
    on the pool's connections (LISTEN, the session advisory locks and their
    settings live on connections of their own, relay.store.pg_cluster), and
    asyncpg's default reset (four statements on every release) was a round
    trip per transaction."""


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; the search text never needs one.
    return value.replace("\x00", " ")


async def _select_delivery(connection: Connection, delivery_id: int) -> DeliveryView:
    row = await connection.fetchrow(
        f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = $1", delivery_id
    )
    assert row is not None  # the caller holds its lock
    return delivery_view(tuple(row))


async def _insert_audit(
    connection: Connection,
    now: float,
    by: str,
    action: str,
    subject: str,
    delivery_ids: Sequence[int] = (),
) -> None:
    await connection.execute(
        numbered(rows.INSERT_AUDIT), *rows.audit_values(now, by, action, subject, delivery_ids)
    )
