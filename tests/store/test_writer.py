"""The group-commit writer: it stops cleanly whatever is queued when it closes,
and after a large batch of webhooks it waits for their senders to come
back, but a lone sender never waits, nor does the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from relay.store.sqlite.writer import GroupCommitWriter


def counter(database: Path) -> Callable[[], sqlite3.Connection]:
    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
        connection.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
        return connection

    return connect


@contextlib.asynccontextmanager
async def waiting_writer(
    tmp_path: Path, *, linger: float, cpu_time: Callable[[], float] = time.monotonic
) -> AsyncIterator[GroupCommitWriter]:
    """A started writer that waits after batches of 4; by default in a process
    that keeps its core busy (its CPU clock runs as fast as the wall clock)."""
    writer = GroupCommitWriter(
        counter(tmp_path / "w.db"), linger_from=4, linger=linger, cpu_time=cpu_time
    )
    await writer.start()
    try:
        yield writer
    finally:
        await writer.close()  # (once more after a test's own close: it does nothing)


def insert(connection: sqlite3.Connection) -> int:
    connection.execute("INSERT INTO t VALUES (1)")
    return 1


async def test_close_commits_what_is_queued_and_returns(tmp_path: Path) -> None:
    # A job queued just before close() (an attempt recorded while relay
    # stops) used the one wake-up close() gave; the writer then waited for
    # another for ever, and `relay serve` hung on SIGTERM until systemd's
    # timeout (the power-cut chaos test saw it in 2 of 5 runs).
    database = tmp_path / "w.db"
    writer = GroupCommitWriter(counter(database))
    await writer.start()
    await asyncio.sleep(0)  # the writer loop is waiting for work
    queued = asyncio.ensure_future(writer.run(insert))
    await asyncio.sleep(0)  # queued, and the writer woken once
    async with asyncio.timeout(5):
        await writer.close()
    assert await queued == 1
    check = sqlite3.connect(database)
    assert check.execute("SELECT count(*) FROM t").fetchone() == (1,)
    check.close()


async def test_after_a_large_batch_the_next_waits_for_as_many_callers(tmp_path: Path) -> None:
    # 64 busy connections settled into two batches of 32, each paying a
    # commit; the next batch now waits for the callers just answered.
    async with waiting_writer(tmp_path, linger=60) as writer:
        async with asyncio.timeout(5):
            first = [writer.submit(insert, sender=True) for _ in range(4)]
            assert await asyncio.gather(*first) == [1] * 4
        assert writer.batches == 1
        coming_back = []
        for _ in range(3):
            coming_back.append(writer.submit(insert, sender=True))
            await asyncio.sleep(0.02)
        assert not any(future.done() for future in coming_back), "committed without the fourth"
        coming_back.append(writer.submit(insert, sender=True))
        async with asyncio.timeout(5):  # on the count, not the 60 s deadline
            await asyncio.gather(*coming_back)
        assert (writer.batches, writer.jobs) == (2, 8)


async def test_the_wait_ends_on_its_deadline(tmp_path: Path) -> None:
    async with waiting_writer(tmp_path, linger=0.05) as writer:
        async with asyncio.timeout(5):
            await asyncio.gather(*(writer.submit(insert, sender=True) for _ in range(4)))
            # Alone: the deadline hands it over.
            assert await writer.submit(insert, sender=True) == 1
        assert (writer.batches, writer.jobs) == (2, 5)


async def test_a_lone_caller_never_waits(tmp_path: Path) -> None:
    # One connection, one request at a time (a Tilda form): batches of one,
    # each committed at once, whatever the wait after a large batch would be.
    async with waiting_writer(tmp_path, linger=60) as writer:
        async with asyncio.timeout(5):
            for _ in range(10):
                assert await writer.submit(insert, sender=True) == 1
        assert writer.batches == 10


async def test_close_does_not_wait_out_the_linger(tmp_path: Path) -> None:
    async with waiting_writer(tmp_path, linger=60) as writer:
        async with asyncio.timeout(5):
            await asyncio.gather(*(writer.submit(insert, sender=True) for _ in range(4)))
            waiting = writer.submit(insert, sender=True)  # the writer waits for three more
            await writer.close()
            assert await waiting == 1


async def test_the_schedulers_work_never_waits(tmp_path: Path) -> None:
    # A claim or an attempt waiting for its commit holds a delivery slot: end
    # to end fell from 4,229 to 3,520 webhooks a second while they waited too.
    async with waiting_writer(tmp_path, linger=60) as writer:
        async with asyncio.timeout(5):
            await asyncio.gather(*(writer.submit(insert, sender=True) for _ in range(4)))
            waiting = writer.submit(insert, sender=True)
            await asyncio.sleep(0.02)
            assert not waiting.done()
            assert await writer.submit(insert) == 1  # a scheduler's job: handed over now
            assert waiting.done()  # ...and the webhook waiting went with it
            # Many of the scheduler's jobs at once make nobody wait after them.
            await asyncio.gather(*(writer.submit(insert) for _ in range(8)))
            assert await writer.submit(insert, sender=True) == 1


async def test_with_the_core_idle_nobody_waits(tmp_path: Path) -> None:
    # Senders each on their own schedule, or a disk slower than the CPU: the
    # loop idles between commits, and a wait would only be added to each.
    async with waiting_writer(tmp_path, linger=60, cpu_time=lambda: 0.0) as writer:
        async with asyncio.timeout(5):
            await asyncio.gather(*(writer.submit(insert, sender=True) for _ in range(4)))
            assert await writer.submit(insert, sender=True) == 1  # not after 60 s
        assert writer.batches == 2


def synchronous(connection: sqlite3.Connection) -> int:
    """The PRAGMA synchronous the job's transaction will commit with (2 FULL, 1 NORMAL)."""
    level: int = connection.execute("PRAGMA synchronous").fetchone()[0]
    return level


@contextlib.asynccontextmanager
async def writer_in(database: Path, journal_mode: str) -> AsyncIterator[GroupCommitWriter]:
    """A started writer on connections as the store opens them (synchronous
    FULL), in `journal_mode`."""

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
        connection.execute(f"PRAGMA journal_mode = {journal_mode}")
        connection.execute("PRAGMA synchronous = FULL")
        return connection

    writer = GroupCommitWriter(connect)
    await writer.start()
    try:
        yield writer
    finally:
        await writer.close()


async def test_a_batch_that_needs_no_fsync_commits_without_one(tmp_path: Path) -> None:
    # The search index's pieces: a webhook arriving while one commits waited
    # for its fsync as well as its own (strace on a lone sender: ~1 in 90 of
    # its answers held two commit fsyncs, 2.7 ms at the median).
    async with writer_in(tmp_path / "w.db", "wal") as writer, asyncio.timeout(5):
        assert await writer.run(synchronous, durable=False) == 1
        assert await writer.run(synchronous) == 2  # put back after
        # One durable job makes its whole batch durable.
        together = await asyncio.gather(
            writer.run(synchronous, durable=False), writer.run(synchronous)
        )
        assert together == [2, 2]
        assert writer.batches == 3


async def test_without_a_wal_every_commit_is_fsynced(tmp_path: Path) -> None:
    # A rollback journal's commit without an fsync can leave the file corrupt
    # after a power cut; only SQLite's WAL makes skipping it safe.
    async with writer_in(tmp_path / "w.db", "delete") as writer, asyncio.timeout(5):
        assert await writer.run(synchronous, durable=False) == 2
