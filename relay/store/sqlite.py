"""The SQLite store: WAL, group-committed writes, reads on their own connection."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import pwd
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiosqlite
import orjson

from relay.store.accept import AcceptJob
from relay.store.base import (
    REJECTIONS_KEPT,
    SEARCH_SECONDS,
    UNKNOWN,
    Accepted,
    AttemptRecord,
    ClaimedDelivery,
    DeliveryView,
    FailureStreak,
    Hold,
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
from relay.store.dialect import SQLITE, placeholders
from relay.store.migrations import LATEST, migrate
from relay.store.reads import Fetch, Reads, purgeable, selection_where
from relay.store.record import RecordJob
from relay.store.rows import (
    CLAIM_DUE,
    CLAIM_EXPIRED,
    EVENT_COLUMNS,
    HEAD_OF_LINE,
    LINK_COPY,
    NEXT_IN_LINE,
    claimed_delivery,
    copy_event,
    delivery_after,
    delivery_view,
    describe_selection,
    insert_audit,
    insert_log,
    resend_subject,
    select_delivery,
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
from relay.store.writer import GroupCommitWriter, Job, unavailable

UNCONFIGURED = "target {target} is not configured: kept pending until it is"
STATEMENTS_CACHED = 600
READER_CACHE_KIB = 512

# What a write job returns, returned by _write after the commit.
T = TypeVar("T")


class SqliteStore(Reads):
    dialect = SQLITE
    # next_due reads the very conditions claim_due leases by.
    next_due_foresees_claims = True
    # One process: its scheduler's memory of the down state is the whole truth.
    claims_probes = False

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
        self._writer = GroupCommitWriter(
            self._connect_writer, checkpoints=self._connect_checkpointer
        )
        # Two read connections (each is a thread): the scheduler's quick
        # lookups never queue behind an operator's slow listing or stats.
        self._reader: aiosqlite.Connection | None = None
        self._slow_reader: aiosqlite.Connection | None = None
        self._snapshot_lock = asyncio.Lock()
        # A third, for searches (one at a time, each stopped at SEARCH_SECONDS):
        # a long search never holds the stats or the event page behind it.
        self._search_reader: aiosqlite.Connection | None = None
        self._search_lock = asyncio.Lock()
        self._search_deadline = math.inf
        self.search_seconds = SEARCH_SECONDS
        # (device, inode) of the database file as opened: see file_problem().
        self._identity: tuple[int, int] | None = None
        self._problems: dict[str, str] = {}

    # Lifecycle

    async def open(self) -> None:
        try:
            await self._writer.start()
            self._reader = await self._connect_reader()
            self._slow_reader = await self._connect_reader()
            self._search_reader = await self._connect_reader()
            # Asked every few thousand steps of the search's statement: nonzero stops it.
            await self._search_reader.set_progress_handler(self._search_expired, 10_000)
        except sqlite3.Error as error:
            await self.close()
            problem = ownership_problem(self.path)
            if problem is not None:
                raise StoreUnavailable(problem) from None
            raise unavailable(error) from None
        opened = os.stat(self.path)
        self._identity = (opened.st_dev, opened.st_ino)

    def file_problem(self) -> str | None:
        """Why the path no longer leads to the database relay has open, or None.

        SQLite keeps writing to a deleted or renamed file as if nothing
        happened: every event acknowledged after `rm relay.db*` would be gone
        at the next start. One stat() (microseconds) compares the path with
        the file as opened.
        """
        if self._identity is None:
            return None
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            change = "was deleted or moved away"
        except OSError as error:
            change = f"cannot be checked ({error.strerror})"
        else:
            if (now.st_dev, now.st_ino) == self._identity:
                return None
            change = "was replaced by another file"
        if change not in self._problems:  # worked out once: it looks through /proc
            self._problems[change] = (
                f"database {self.path} {change} while relay had it open: new webhooks get"
                f" 503; deliveries already accepted go on from the open file"
                f"{_open_copy(self.path)}. Move the same file back, or restart relay"
                " to start a new database"
            )
        return self._problems[change]

    async def _connect_reader(self) -> aiosqlite.Connection:
        reader = await aiosqlite.connect(self.path, isolation_level=None)
        await reader.execute("PRAGMA query_only = ON")
        # Sorts and temporary tables in memory: a temp file per query fails
        # ("unable to open database file") once file descriptors run short.
        await reader.execute("PRAGMA temp_store = MEMORY")
        await reader.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        # Pages cached per reader (SQLite's default is 2 MiB): the readers
        # look up little between an operator's pages; the writer keeps its 2.
        await reader.execute(f"PRAGMA cache_size = -{READER_CACHE_KIB}")
        return reader

    async def close(self) -> None:
        for reader in (self._reader, self._slow_reader, self._search_reader):
            if reader is not None:
                await reader.close()
        self._reader = self._slow_reader = self._search_reader = None
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
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=self._busy_timeout,
            # A batch's events are one INSERT of its size (relay.store.accept):
            # one prepared per batch size seen, besides the other statements.
            cached_statements=STATEMENTS_CACHED,
        )
        try:
            if connection.execute("PRAGMA page_count").fetchone()[0] == 0:
                # Only a new, empty database can take this: it lets retention
                # give freed pages back to the file system.
                connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL mode (got {mode})")
            connection.execute(f"PRAGMA synchronous = {self._synchronous}")
            connection.execute("PRAGMA temp_store = MEMORY")  # see _connect_reader
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

    def _connect_checkpointer(self) -> sqlite3.Connection:
        """The checkpointer's connection (relay.store.checkpointer), opened after
        the writer's: it only copies the WAL into the file, syncing as the writer does."""
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            connection.execute(f"PRAGMA synchronous = {self._synchronous}")
        except BaseException:
            connection.close()
            raise
        return connection

    async def _write(
        self, job: Job[T], *, queue_timeout: float | None = None, durable: bool = True
    ) -> T:
        return await self._writer.run(job, queue_timeout=queue_timeout, durable=durable)

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[None]:
        """Several reads that must agree (an event, its deliveries, their attempts):
        one read transaction on the slow reader, one reader at a time."""
        reader = self._slow_reader
        if reader is None:
            raise StoreUnavailable("store is not open")
        async with self._snapshot_lock:
            try:
                await reader.execute("BEGIN")
            except sqlite3.Error as error:
                raise unavailable(error) from None
            try:
                yield
            finally:
                with contextlib.suppress(sqlite3.Error):
                    await reader.execute("COMMIT")

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[Fetch]:
        async with self._snapshot():
            yield self._slow_read

    async def _slow_read(self, sql: str, params: Sequence[Any] = (), /) -> list[sqlite3.Row]:
        return await self._read(sql, params, slow=True)

    async def _read(
        self, sql: str, params: Sequence[Any] = (), *, slow: bool = False
    ) -> list[sqlite3.Row]:
        reader = self._slow_reader if slow else self._reader
        if reader is None:
            raise StoreUnavailable("store is not open")
        try:
            return list(await reader.execute_fetchall(sql, params))
        except sqlite3.Error as error:
            raise unavailable(error) from None

    def _search_expired(self) -> bool:
        return time.monotonic() > self._search_deadline  # (on the reader's thread)

    async def _search(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        reader = self._search_reader
        if reader is None:
            raise StoreUnavailable("store is not open")
        async with self._search_lock:
            self._search_deadline = time.monotonic() + self.search_seconds
            try:
                return list(await reader.execute_fetchall(sql, params))
            except sqlite3.OperationalError as error:
                if "interrupt" in str(error):
                    raise SearchTooSlow(self.search_seconds) from None
                raise unavailable(error) from None
            except sqlite3.Error as error:
                raise unavailable(error) from None
            finally:
                self._search_deadline = math.inf

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
        guard = self._still_the_file if from_sender else None
        job = AcceptJob(event, deliveries, now, refuse_conflict, guard)
        return self._writer.submit(job, queue_timeout=self._write_queue_timeout, sender=from_sender)

    def _still_the_file(self) -> None:
        """On the writer thread, before a batch of events is stored: refuse to
        acknowledge into a file that is no longer the database's path."""
        problem = self.file_problem()
        if problem is not None:
            raise StoreUnavailable(problem)

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
        then: Transition,
        now: float,
        hold: Hold | None = None,
    ) -> FailureStreak:
        # A manual attempt is one more try, not a step of the schedule; nor is
        # a probe of a down target.
        waits = isinstance(then, Waits)
        cycle = delivery.attempts_in_cycle + (1 if attempt.in_cycle else 0)
        status, next_at, error = delivery_after(then, attempt)
        job = RecordJob(delivery, attempt, status, next_at, error, waits, cycle, now, hold)
        streak: FailureStreak = await self._write(job)
        return streak

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

    # Indexing

    async def index_events(self, documents: Sequence[SearchDocument], through: int) -> None:
        rows = [(doc.event_id, doc.text, doc.digits, doc.event_id) for doc in documents]

        def job(connection: sqlite3.Connection) -> None:
            connection.executemany(
                "INSERT OR REPLACE INTO event_search (rowid, text, digits)"
                " SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM events WHERE id = ?)",
                rows,
            )
            connection.execute(
                "UPDATE search_progress SET indexed_through = max(indexed_through, ?) WHERE id = 1",
                (through,),
            )

        # Made again from the events if a power cut undoes it: no fsync of its own.
        await self._write(job, durable=False)

    # Operator verbs

    async def resend(self, resend: Resend, now: float) -> int:
        def job(connection: sqlite3.Connection) -> int | None:
            row = connection.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE id = ?", (resend.original_id,)
            ).fetchone()
            if row is None:
                return None
            event = copy_event(row, resend, now)
            deliveries = [NewDelivery(target) for target in resend.targets]
            copy_id = AcceptJob(event, deliveries, now)(connection).event_id
            connection.execute(
                "INSERT INTO resends (copy_id, original_id, at, by) VALUES (?, ?, ?, ?)",
                (copy_id, resend.original_id, now, resend.by),
            )
            connection.execute(LINK_COPY, (resend.original_id, copy_id))
            copies = [
                row[0]
                for row in connection.execute(
                    "SELECT id FROM deliveries WHERE event_id = ? ORDER BY id", (copy_id,)
                )
            ]
            subject = resend_subject(resend, copy_id)
            insert_audit(connection, now, resend.by, "resend", subject, copies)
            return copy_id

        copy_id: int | None = await self._write(job)
        if copy_id is None:
            raise NotFound(f"no event {resend.original_id}")
        return copy_id

    async def retry_now(self, delivery_id: int, now: float, *, by: str = UNKNOWN) -> DeliveryView:
        def job(connection: sqlite3.Connection) -> VerbResult:
            row = connection.execute(
                "SELECT status, resume_status, next_attempt_at, target, order_key"
                " FROM deliveries WHERE id = ?",
                (delivery_id,),
            ).fetchone()
            if row is None:
                return Missing()
            status = Status(row[0])
            step = retry_now_step(status, row[1], row[2], row[4])
            if isinstance(step, NotApplicable):
                return step
            if step is RetryNow.WAITING_TURN:
                head = connection.execute(HEAD_OF_LINE, (row[3], row[4])).fetchone()
                return waiting_behind(head[0], head[1])
            if step is RetryNow.FROM_PENDING:
                connection.execute(
                    "UPDATE deliveries SET resume_status = 'pending', resume_at = next_attempt_at,"
                    " next_attempt_at = ?, updated_at = ? WHERE id = ?",
                    (now, now, delivery_id),
                )
            elif step is RetryNow.FROM_DEAD:
                connection.execute(
                    "UPDATE deliveries SET status = 'pending', resume_status = 'dead',"
                    " resume_at = NULL, next_attempt_at = ?, updated_at = ? WHERE id = ?",
                    (now, now, delivery_id),
                )
            else:
                return delivery_view(select_delivery(connection, delivery_id))
            insert_log(
                connection,
                [delivery_id],
                now,
                "retry",
                f"one more attempt (was {status.value})",
                by,
            )
            insert_audit(connection, now, by, "retry", f"delivery {delivery_id}", [delivery_id])
            return delivery_view(select_delivery(connection, delivery_id))

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
            status = Status(row[0])
            if (refused := may_skip(status)) is not None:
                return refused
            connection.execute(
                "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL,"
                " resume_status = NULL, resume_at = NULL, last_error = ?, updated_at = ?"
                " WHERE id = ?",
                (f"skipped by an operator (was {status.value})", now, delivery_id),
            )
            insert_log(
                connection,
                [delivery_id],
                now,
                "skip",
                f"not to be sent (was {status.value})",
                by,
            )
            insert_audit(connection, now, by, "skip", f"delivery {delivery_id}", [delivery_id])
            connection.execute(NEXT_IN_LINE, (now, now, delivery_id))
            return delivery_view(select_delivery(connection, delivery_id))

        return await self._delivery_verb(delivery_id, job)

    async def requeue(self, selection: Selection, now: float, *, by: str = UNKNOWN) -> list[int]:
        if selection.status in (Status.PENDING, Status.IN_FLIGHT):
            return []
        where, params = selection_where(selection, SQLITE)

        def job(connection: sqlite3.Connection) -> list[int]:
            ids = [
                row[0]
                for row in connection.execute(
                    # A delivered or skipped one sent again is a person's resend,
                    # outside its key's order (it would otherwise cut in line).
                    "UPDATE deliveries SET status = 'pending', cycle_attempts = 0, fails_alone = 0,"
                    " next_attempt_at = ?, lease_until = NULL, resume_status = NULL,"
                    " resume_at = NULL, updated_at = ?, order_key = CASE WHEN status"
                    " IN ('delivered', 'skipped', 'resolved') THEN NULL ELSE order_key END"
                    f" WHERE {where} RETURNING id",
                    [now, now, *params],
                ).fetchall()
            ]
            ids.sort()
            insert_log(
                connection, ids, now, "requeue", f"fresh retry cycle (was {selection.status})", by
            )
            insert_audit(connection, now, by, "requeue", describe_selection(selection), ids)
            return ids

        result: list[int] = await self._write(job)
        return result

    async def skip_selected(
        self, selection: Selection, now: float, *, by: str = UNKNOWN
    ) -> list[int]:
        if selection.status not in (Status.PENDING, Status.DEAD):
            return []
        where, params = selection_where(selection, SQLITE)

        def job(connection: sqlite3.Connection) -> list[int]:
            ids = [
                row[0]
                for row in connection.execute(
                    f"SELECT id FROM deliveries WHERE {where} ORDER BY id", params
                ).fetchall()
            ]
            was = selection.status.value
            for delivery_id in ids:
                connection.execute(
                    "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL,"
                    " resume_status = NULL, resume_at = NULL, last_error = ?, updated_at = ?"
                    " WHERE id = ?",
                    (f"skipped by an operator (was {was})", now, delivery_id),
                )
                # In id order: skipping the head of a key lets the next go,
                # unless it is skipped too, which lets the one after it go.
                connection.execute(NEXT_IN_LINE, (now, now, delivery_id))
            insert_log(connection, ids, now, "skip", f"not to be sent (was {was})", by)
            insert_audit(connection, now, by, "skip", describe_selection(selection), ids)
            return ids

        result: list[int] = await self._write(job)
        return result

    async def set_paused(self, target: str, paused: bool, now: float, *, by: str = UNKNOWN) -> None:
        def job(connection: sqlite3.Connection) -> None:
            action = "pause" if paused else "resume"
            insert_audit(connection, now, by, action, f"target {target}")
            connection.execute(
                "INSERT INTO targets (name, paused, paused_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET paused = excluded.paused,"
                " paused_at = excluded.paused_at",
                (target, int(paused), now if paused else None),
            )
            if not paused:
                # A person resuming a down target wants to know now: probe at once.
                connection.execute(
                    "UPDATE targets SET probe_at = min(probe_at, ?)"
                    " WHERE name = ? AND down_since IS NOT NULL",
                    (now, target),
                )

        await self._write(job)

    async def purge(
        self, cutoffs: Mapping[str, float], default_cutoff: float, *, limit: int, dry_run: bool
    ) -> int:
        if dry_run:
            return await self._purgeable(cutoffs, default_cutoff)
        where, params = purgeable(SQLITE, cutoffs, default_cutoff)

        def job(connection: sqlite3.Connection) -> int:
            event_ids = [
                row[0]
                for row in connection.execute(
                    f"SELECT id FROM events WHERE {where} ORDER BY received_at LIMIT ?",
                    [*params, limit],
                )
            ]
            if not event_ids:
                return 0
            marks = placeholders(len(event_ids))
            delivery_ids = [
                row[0]
                for row in connection.execute(
                    f"SELECT id FROM deliveries WHERE event_id IN ({marks})", event_ids
                )
            ]
            if delivery_ids:
                dmarks = placeholders(len(delivery_ids))
                connection.execute(
                    f"DELETE FROM attempts WHERE delivery_id IN ({dmarks})", delivery_ids
                )
                connection.execute(
                    f"DELETE FROM delivery_log WHERE delivery_id IN ({dmarks})", delivery_ids
                )
                connection.execute(f"DELETE FROM deliveries WHERE id IN ({dmarks})", delivery_ids)
            connection.execute(f"DELETE FROM events WHERE id IN ({marks})", event_ids)
            return len(event_ids)

        removed: int = await self._write(job)
        return removed

    async def flag_unconfigured(self, configured: Collection[str], now: float) -> dict[str, int]:
        names = list(configured)

        def job(connection: sqlite3.Connection) -> dict[str, int]:
            counts: dict[str, int] = {}
            for target, count in connection.execute(
                "SELECT target, COUNT(*) FROM deliveries WHERE status IN ('pending', 'in_flight')"
                f" AND target NOT IN ({placeholders(len(names))}) GROUP BY target",
                names,
            ).fetchall():
                counts[target] = count
                # In flight too: a lease given back unused keeps the note.
                connection.execute(
                    "UPDATE deliveries SET last_error = ?, updated_at = ?"
                    " WHERE status IN ('pending', 'in_flight') AND target = ?",
                    (UNCONFIGURED.format(target=target), now, target),
                )
            return counts

        result: dict[str, int] = await self._write(job)
        return result

    async def record_rejection(self, rejection: Rejection) -> None:
        headers = orjson.dumps(rejection.headers)

        def job(connection: sqlite3.Connection) -> None:
            connection.execute(
                "INSERT INTO rejections (route, at, remote_addr, reason, detail, headers)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    rejection.route,
                    rejection.at,
                    rejection.remote_addr,
                    rejection.reason,
                    rejection.detail,
                    headers,
                ),
            )
            connection.execute(
                "DELETE FROM rejections WHERE route = ? AND id <= (SELECT id FROM rejections"
                " WHERE route = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (rejection.route, rejection.route, REJECTIONS_KEPT),
            )

        await self._write(job)

    async def backup(self, destination: Path) -> int:
        return await asyncio.to_thread(self._backup, destination)

    def _backup(self, destination: Path) -> int:
        # SQLite's online backup, in one step: one read snapshot of the whole
        # database (WAL lets writers go on meanwhile), written to a temporary
        # file that becomes the destination only once complete and synced.
        partial = destination.with_name(destination.name + ".partial")
        partial.unlink(missing_ok=True)
        try:
            # The copy holds people's data like the database itself: ours alone.
            os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            source = sqlite3.connect(self.path, timeout=self._busy_timeout)
            try:
                copy = sqlite3.connect(partial)
                try:
                    source.backup(copy)
                    copy.execute("PRAGMA journal_mode = DELETE")
                    if copy.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                        raise StoreError(f"{partial}: the copy failed its integrity check")
                    events: int = copy.execute("SELECT COUNT(*) FROM events").fetchone()[0]
                finally:
                    copy.close()
            finally:
                source.close()
            with partial.open("rb") as handle:
                os.fsync(handle.fileno())
            os.replace(partial, destination)
        except sqlite3.Error as error:
            partial.unlink(missing_ok=True)
            raise unavailable(error) from None
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise StoreError(f"cannot write {destination}: {error.strerror or error}") from None
        return events

    async def heartbeat(self, now: float) -> None:
        problem = self.file_problem()
        if problem is not None:
            raise StoreUnavailable(problem)

        def job(connection: sqlite3.Connection) -> None:
            connection.execute("INSERT OR REPLACE INTO heartbeat (id, at) VALUES (1, ?)", (now,))

        await self._write(job)

    async def reclaim_space(self) -> int:
        def job(connection: sqlite3.Connection) -> int:
            free: int = connection.execute("PRAGMA freelist_count").fetchone()[0]
            # Python's sqlite3 steps this pragma once, and each step frees one
            # page: ask page by page, a bounded number per transaction.
            step = min(free, 2000)
            for _ in range(step):
                connection.execute("PRAGMA incremental_vacuum(1)")
            return step

        freed: int = await self._write(job)
        return freed

    async def release_memory(self) -> None:
        # Each connection's page cache, kept full after a burst: up to 2 MiB
        # for the writer and READER_CACHE_KIB for each reader. The writer's
        # prepared statements too: it holds more of them, and larger.
        def job(connection: sqlite3.Connection) -> None:
            _forget_prepared(connection)
            connection.execute("PRAGMA shrink_memory")

        await self._write(job)
        await self._read("PRAGMA shrink_memory")
        async with self._snapshot_lock:  # not in the middle of a snapshot's reads
            await self._read("PRAGMA shrink_memory", slow=True)


def _forget_prepared(connection: sqlite3.Connection) -> None:
    """Finalize every statement Python's sqlite3 keeps prepared on `connection`.

    A batch of n events is one INSERT of n rows (relay.store.accept), and each
    batch size seen stays prepared, up to STATEMENTS_CACHED of them: after a
    burst of a few sizes that was 3 MiB, more than the page cache. Python has
    no call for it, but its cache is an lru_cache the connection refers to
    (CPython 3.11 to 3.13), reached through the collector. Should a later
    Python hide it, nothing is cleared, and tests/store/test_memory_release.py
    fails to say so. The next batch of a size prepares it again: ~150 us.
    """
    for referent in gc.get_referents(connection):
        if callable(getattr(referent, "cache_clear", None)):
            referent.cache_clear()


def ownership_problem(database: Path) -> str | None:
    """Why this process may not write the database or its -wal/-shm files: the
    owner and the fix. A backup restored as root (`cp` into a fresh
    /var/lib/relay) leaves a root-owned file the service's user cannot write,
    and SQLite says only "attempt to write a readonly database"."""
    for path in (database, *(database.with_name(database.name + s) for s in ("-wal", "-shm"))):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if os.access(path, os.R_OK | os.W_OK):
            continue
        try:
            owner = f"{pwd.getpwuid(info.st_uid).pw_name} (uid {info.st_uid})"
        except KeyError:
            owner = f"uid {info.st_uid}"
        return (
            f"database cannot be written: {path} is owned by {owner}, mode"
            f" {stat.S_IMODE(info.st_mode):o}, and relay runs as uid {os.geteuid()}; give it"
            f" to relay's user, e.g. after a restore as root: sudo chown --reference="
            f"{path.parent} {path} (docs/operate.md, Backups)"
        )
    return None


def _open_copy(path: Path) -> str:
    """Where this process still holds a deleted database, for copying it back."""
    for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == f"{path.resolve()} (deleted)":
            return f" (a copy can be taken from /proc/{os.getpid()}/fd/{fd})"
    return ""
