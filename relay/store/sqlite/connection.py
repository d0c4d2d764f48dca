"""The SQLite store's connections: one writer thread (group commit,
relay.store.sqlite.writer), three reader threads, and the file they have open."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pwd
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiosqlite

from relay.store.base import SEARCH_SECONDS, SearchTooSlow, StoreError, StoreUnavailable
from relay.store.dialect import SQLITE
from relay.store.migrations import LATEST, migrate
from relay.store.reads import Fetch, Reads
from relay.store.sqlite.writer import GroupCommitWriter, Job, unavailable

STATEMENTS_CACHED = 600
READER_CACHE_KIB = 512


def _null(value: None) -> None:
    return value


# Python's sqlite3 binds int, float, str and bytearray as they are; any other
# value (bytes, None) is first offered to the adapters, and with none
# registered for its type the offer raises and swallows an AttributeError per
# value: a webhook's body, headers and empty columns paid that on every
# insert. Adapters that give the value back unchanged make it a dict lookup
# and a call; what is stored is the same.
sqlite3.register_adapter(bytes, bytes)  # bytes(b) is b itself for a bytes object
sqlite3.register_adapter(type(None), _null)


# What a write job returns, returned by _write after the commit.
T = TypeVar("T")


class SqliteConnection(Reads):
    dialect = SQLITE

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
            # A batch's events are one INSERT of its size (relay.store.sqlite.accept):
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
        """The checkpointer's connection (relay.store.sqlite.checkpointer), opened after
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
