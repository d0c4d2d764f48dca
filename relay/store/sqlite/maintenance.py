"""The SQLite store's maintenance: retention, backups, space and memory given back."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from relay.store.base import StoreError
from relay.store.dialect import SQLITE, placeholders
from relay.store.reads import purgeable
from relay.store.sqlite.connection import SqliteConnection
from relay.store.sqlite.writer import unavailable


class SqliteMaintenance(SqliteConnection):
    async def purge(
        self, cutoffs: Mapping[str, float], default_cutoff: float, *, limit: int, dry_run: bool
    ) -> int:
        if dry_run:
            return await self._purgeable(cutoffs, default_cutoff)
        where, params = purgeable(SQLITE, cutoffs, default_cutoff)

        def job(connection: sqlite3.Connection) -> int:
            event_ids = [
                event_id
                for (event_id,) in connection.execute(
                    f"SELECT id FROM events WHERE {where} ORDER BY received_at LIMIT ?",
                    [*params, limit],
                )
            ]
            if not event_ids:
                return 0
            marks = placeholders(len(event_ids))
            delivery_ids = [
                delivery_id
                for (delivery_id,) in connection.execute(
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

    A batch of n events is one INSERT of n rows (relay.store.sqlite.accept), and each
    batch size seen stays prepared, up to STATEMENTS_CACHED of them: after a
    burst of a few sizes that was more than the page cache. Python has
    no call for it, but its cache is an lru_cache the connection refers to
    (CPython 3.11 to 3.13), reached through the collector. Should a later
    Python hide it, nothing is cleared, and tests/store/test_memory_release.py
    fails to say so. The next batch of a size prepares it again, once.
    """
    for referent in gc.get_referents(connection):
        if callable(getattr(referent, "cache_clear", None)):
            referent.cache_clear()
