"""The PostgreSQL store's connections: the pool, its transactions, the
group commits of intake and records, and the wake-ups instances send each other."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import Any, TypeVar

import asyncpg

from relay.core.errors import one_line
from relay.core.pgurl import masked_url
from relay.store.accept import AcceptJob
from relay.store.base import (
    SEARCH_SECONDS,
    Accepted,
    SearchTooSlow,
    Step,
    StoreError,
    StoreUnavailable,
)
from relay.store.dialect import POSTGRES, numbered
from relay.store.postgres.accept import store_batch
from relay.store.postgres.batch import GroupCommit
from relay.store.postgres.cluster import (
    DEAD_AFTER,
    SESSION_POOLING_NEEDED,
    STOPPED,
    Leadership,
    TargetLimits,
    named,
    sessions_shared,
)
from relay.store.postgres.errors import DRIVER_ERRORS, Connection, at, unavailable
from relay.store.postgres.record import Record, record_batch
from relay.store.postgres.schema import LATEST, migrate
from relay.store.reads import Fetch, Reads

T = TypeVar("T")
log = logging.getLogger("relay.store")


# The channel instances wake each other on: new events and operator actions.
CHANNEL = "relay_wake"
# New events wake the other instances at most this often (a wake-up is a
# hint: they poll too).
ANNOUNCE_SPACING = 0.05


class PostgresConnection(Reads):
    dialect = POSTGRES

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
        self._records: GroupCommit[Record, Step] | None = None
        self._announcing: asyncio.Task[None] | None = None
        self._announce_again = False
        self._started_at: float | None = None
        self._limits: dict[str, TargetLimits] = {}
        self._heartbeats: asyncio.Task[None] | None = None
        self._claimed = False  # this store leased deliveries (relay serve's, not a command's)
        self._beaten_at: float | None = None  # time.monotonic() of the last heartbeat
        # The deliveries each claim that failed once its transaction had run
        # leased, each with that claim's (now, lease_until): it may have
        # committed with its answer lost, leasing them to this instance while
        # no attempt here sends them. Until those leases run out, or a claim
        # hands them out, the next claims take them back (cluster.lapsed).
        self._unanswered_claims: dict[int, tuple[float, float]] = {}
        # The answer of each record (delivery id, number, started_at) whose
        # transaction ran to its end and then failed: it may have committed
        # with its answer lost. The scheduler records it again; that record
        # is not kept twice, and answers what the first did (record_attempt).
        self._unanswered_records: dict[tuple[int, int, float], Step] = {}
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
        try:
            connection = await asyncpg.connect(*args, **kwargs)
        except OSError as error:
            if isinstance(error, TimeoutError):
                raise
            # The driver's error names neither the socket nor the port it
            # tried ("[Errno 2] No such file or directory" when the server's
            # socket is gone): the operator's next question is which.
            raise ConnectionError(
                f"no PostgreSQL server answers at {self.path} ({one_line(error)})"
            ) from None
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


def default_instance_id() -> str:
    """Host, process and a random part: unique even when a pid is reused."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def _reset(connection: asyncpg.Connection) -> None:
    """A connection given back to the pool: asyncpg has already rolled back a
    transaction left open. Nothing else to undo: relay keeps no session state
    on the pool's connections (LISTEN, the session advisory locks and their
    settings live on connections of their own, relay.store.postgres.cluster), and
    asyncpg's default reset (four statements on every release) was a round
    trip per transaction."""
