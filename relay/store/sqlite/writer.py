"""Group commit: one thread owns the write connection; many callers share a commit.

Callers hand in a job (a function of the connection). The writer takes every
job waiting, runs them in one transaction on its own thread, commits (one
fsync; none for a batch of jobs that need none, see submit), and only then
answers each caller with its own job's result. A caller's answer therefore
always comes from the very transaction that held its rows: if that commit
fails, every job in it fails, and nobody is told "stored" for a row that is
not on disk.

One batch is on the thread at a time; what arrives meanwhile is the next
batch, handed over as soon as the thread answers. The thread is fed by a
SimpleQueue and answers with one call_soon_threadsafe per batch: no executor,
no task and no wake-up per job (at thousands of webhooks a second, those
cost more than the commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

from relay.store.base import StoreError, StoreUnavailable
from relay.store.sqlite.checkpointer import BACKSTOP_PAGES, Checkpointer

T = TypeVar("T")


class Batched(Protocol[T]):
    """A job of a kind that is run a run at a time: its class's `run_many`
    gets the jobs of that kind queued one after another, and answers one
    result each, in order (many webhooks' events in one statement)."""

    @staticmethod
    def run_many(connection: sqlite3.Connection, jobs: Sequence[Any], /) -> list[T]: ...


# A function of the connection, or a Batched request.
Job: TypeAlias = "Callable[[sqlite3.Connection], T] | Batched[T]"

# Error codes that say "the database cannot take writes now", as opposed to
# "this one job is wrong". Trying the jobs of a batch one by one will not help.
_ENVIRONMENTAL = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_PROTOCOL,
}


def is_environmental(error: BaseException) -> bool:
    if isinstance(error, StoreUnavailable):  # a job's own check: the file is gone
        return True
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _ENVIRONMENTAL


def unavailable(error: BaseException) -> StoreError:
    """A driver error as the store's own; the message says what the disk said."""
    if isinstance(error, StoreError):
        return error
    if is_environmental(error):
        return StoreUnavailable(f"database cannot be written: {error}")
    return StoreError(f"database error: {error}")


class _Pending:
    """A job in the queue. (A plain class, one made for every webhook: mypyc
    compiles its __init__, not one a dataclass generates.)"""

    def __init__(
        self,
        job: Job[Any],
        future: asyncio.Future[Any],
        deadline: float,  # loop time after which, still untaken, the job gives up
        sender: bool,  # a webhook to acknowledge (its sender comes back once answered)
        durable: bool,  # its commit must be fsynced before it is answered
    ) -> None:
        self.job = job
        self.future = future
        self.deadline = deadline
        self.sender = sender
        self.durable = durable
        self.taken = False


class _Failed:
    """A job's failure, carried back from the thread to its caller."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_NORMAL = 1  # PRAGMA synchronous: 1 is NORMAL, 2 FULL, 3 EXTRA

_STOP = None  # put on the thread's queue: close the connection and end

# After a commit of at least LINGER_FROM senders' webhooks, while relay keeps
# a core at least SATURATED busy, the next batch waits up to LINGER_SECONDS
# for as many more (see _answered). A lone sender, whose batches are of one,
# never waits; nor does the scheduler's work.
LINGER_FROM = 8
LINGER_SECONDS = 0.002
SATURATED = 0.8
BUSY_WINDOW = 0.1  # seconds over which "busy" is measured: a commit's 2 ms are too few


class GroupCommitWriter:
    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        checkpoints: Callable[[], sqlite3.Connection] | None = None,
        max_batch: int = 1000,
        linger_from: int = LINGER_FROM,
        linger: float = LINGER_SECONDS,
        cpu_time: Callable[[], float] = time.process_time,
    ) -> None:
        self._connect = connect
        # Checkpoints on a connection of their own, beside the commits
        # (relay.store.sqlite.checkpointer); without one, SQLite's inside them.
        self._checkpointer = Checkpointer(checkpoints) if checkpoints is not None else None
        self._max_batch = max_batch
        self._linger_from = linger_from
        self._linger_seconds = linger
        self._cpu_time = cpu_time
        self._busy_since = (0.0, 0.0)  # (loop time, CPU time) where the window began
        self._busy = False
        self._inbox: queue.SimpleQueue[list[_Pending] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connection: sqlite3.Connection | None = None
        # PRAGMA synchronous (2 is FULL): as the store opened the connection,
        # and as it is now (NORMAL after a batch that needed no fsync).
        self._synchronous = self._level = 0
        # Only in WAL mode: there a commit without an fsync may be undone by
        # a power cut but never corrupts the file, and the next fsynced
        # commit covers it. A rollback journal gives no such promise.
        self._wal = False
        self._queue: list[_Pending] = []
        self._on_thread = False  # a batch is on the thread
        self._handing = False  # a hand-over is scheduled for this loop turn
        # After a large batch: the next hand-over waits (at most LINGER_SECONDS)
        # until this many jobs are queued (see _answered).
        self._awaited = 0
        self._linger: asyncio.TimerHandle | None = None
        self._idle: asyncio.Future[None] | None = None  # close() waits for the last batch
        self._ended: asyncio.Future[None] | None = None  # the thread is done
        self._sweeper: asyncio.TimerHandle | None = None
        self._running = False
        self._closing = False
        # Counters for metrics and benchmarks: batches committed, jobs in them.
        self.batches = 0
        self.jobs = 0

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        self._ended = loop.create_future()
        self._worker = threading.Thread(
            target=self._work, args=(opened,), name="relay-writer", daemon=True
        )
        self._worker.start()
        try:
            await opened
        except BaseException:
            await self._join()
            raise
        self._running = True

    async def run(
        self, job: Job[T], *, queue_timeout: float | None = None, durable: bool = True
    ) -> T:
        """Run `job` in the next group transaction and return its result after the commit."""
        return await self.submit(job, queue_timeout=queue_timeout, durable=durable)

    def submit(
        self,
        job: Job[T],
        *,
        queue_timeout: float | None = None,
        sender: bool = False,
        durable: bool = True,
    ) -> asyncio.Future[T]:
        """Queue `job` for the next group transaction: the future has its result
        after the commit (ingress answers from it without a task per request).
        A `sender` job stores a webhook whose sender waits for the answer.

        A job that is not `durable` writes what can be made again (the search
        index, with its high-water mark): a batch of only such jobs commits
        without an fsync of its own (synchronous NORMAL, as SQLite's WAL
        allows without risk to the file), and the next durable commit's fsync
        covers it. A power cut may undo it; nothing that was answered "stored"
        depends on it. So the index's commits do not hold a webhook that
        arrives meanwhile up for an fsync too.

        `queue_timeout` bounds the wait for a place in a transaction; once the
        job is in one, its outcome is awaited whatever it takes (the
        connection's busy timeout bounds that), because giving up then could
        answer "failed" for a row that is in fact committed.
        """
        loop = self._loop
        if self._closing or not self._running or loop is None:
            raise StoreUnavailable("store is closed")
        future: asyncio.Future[T] = loop.create_future()
        deadline = loop.time() + queue_timeout if queue_timeout is not None else float("inf")
        self._queue.append(_Pending(job, future, deadline, sender, durable))
        if (
            not self._on_thread
            and not self._handing
            and (not sender or len(self._queue) >= self._awaited)
        ):
            # Not at once: the other requests of this loop turn join the batch.
            self._handing = True
            loop.call_soon(self._hand_over)
        if queue_timeout is not None and self._sweeper is None:
            # One timer for the whole queue, not one per request.
            self._sweeper = loop.call_later(queue_timeout / 2, self._sweep, queue_timeout / 2)
        return future

    def _hand_over(self) -> None:
        """Give the thread the next batch, if it is free and something waits."""
        self._handing = False
        if self._on_thread:
            return
        self._awaited = 0
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        batch = [p for p in self._queue[: self._max_batch] if not p.future.done()]
        del self._queue[: self._max_batch]
        if not batch:
            if self._queue:
                self._hand_over()
            elif self._idle is not None and not self._idle.done():
                self._idle.set_result(None)
            return
        for pending in batch:
            pending.taken = True
        self._on_thread = True
        self._inbox.put(batch)

    def _answered(self, batch: list[_Pending], results: list[Any]) -> None:
        """On the loop: the thread's transaction is over; answer its callers."""
        self._on_thread = False
        self.batches += 1
        self.jobs += len(batch)
        for pending, result in zip(batch, results, strict=True):
            future = pending.future
            if future.done():
                continue
            if isinstance(result, _Failed):
                future.set_exception(result.error)
            else:
                future.set_result(result)
        senders = sum(pending.sender for pending in batch)
        if senders >= self._linger_from and self._saturated() and not self._closing:
            # Senders that came this many at once are busy, and most send
            # again as soon as they are answered: the next batch waits for as
            # many (or LINGER_SECONDS) to share its commit. Otherwise, under
            # load, batches settle into two halves, one committing while the
            # other gathers, and each pays a commit (PostgreSQL's commit_delay
            # and commit_siblings, by count; what it bought: bench/RESULTS.md).
            # Three limits:
            # - only while relay keeps its core busy: the loop then has
            #   requests to read meanwhile, and the wait costs nobody time.
            #   With the core idle between commits (senders on their own
            #   schedules, a disk slower than the CPU) it would only be added
            #   to every commit (senders that pause between requests would
            #   get far fewer commits a second);
            # - the scheduler's claims and attempts never wait, and one queued
            #   ends the wait: each commit they wait for holds a delivery slot;
            # - a lone sender's batches are of one: it never waits.
            self._awaited = min(len(self._queue) + senders, self._max_batch)
            if len(self._queue) < self._awaited and all(p.sender for p in self._queue):
                assert self._loop is not None
                self._linger = self._loop.call_later(self._linger_seconds, self._hand_over)
                return
        self._hand_over()

    def _saturated(self) -> bool:
        """relay used at least SATURATED of a core over the last BUSY_WINDOW."""
        assert self._loop is not None
        now = self._loop.time()
        wall, cpu = self._busy_since
        if now - wall >= BUSY_WINDOW:
            used = self._cpu_time()
            self._busy = used - cpu >= SATURATED * (now - wall)
            self._busy_since = (now, used)
        return self._busy

    def _sweep(self, every: float) -> None:
        """Fail the jobs that waited past their deadline without joining a transaction."""
        self._sweeper = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for pending in self._queue:
            if not pending.taken and not pending.future.done() and now >= pending.deadline:
                waited = every * 2
                pending.future.set_exception(
                    StoreUnavailable(f"no write slot within {waited:g}s: the database is busy")
                )
        if self._queue:
            self._sweeper = loop.call_later(every, self._sweep, every)

    async def close(self) -> None:
        """Commit what is queued, then close the connection and the thread."""
        self._closing = True
        if self._running and (self._queue or self._on_thread):
            assert self._loop is not None
            self._idle = self._loop.create_future()
            self._hand_over()
            await self._idle
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._running = False
        await self._join()

    async def _join(self) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        self._inbox.put(_STOP)
        if self._ended is not None:
            await self._ended  # the thread closed the connection and ends
        worker.join()

    # The methods below run on the writer thread.

    def _work(self, opened: asyncio.Future[None]) -> None:
        loop = self._loop
        assert loop is not None
        checkpointer = self._checkpointer
        try:
            self._connection = self._connect()
            level = self._connection.execute("PRAGMA synchronous").fetchone()[0]
            self._synchronous = self._level = level
            mode = self._connection.execute("PRAGMA journal_mode").fetchone()[0]
            self._wal = str(mode).lower() == "wal"
            if checkpointer is not None:
                self._connection.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
                checkpointer.start()  # last: nothing after it can fail and leave it running
        except BaseException as error:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            loop.call_soon_threadsafe(_settle, opened, error)
            loop.call_soon_threadsafe(_settle, self._ended, None)
            return
        loop.call_soon_threadsafe(_settle, opened, None)
        try:
            while (batch := self._inbox.get()) is not _STOP:
                results = self._commit(batch)
                loop.call_soon_threadsafe(self._answered, batch, results)
                if checkpointer is not None:
                    checkpointer.committed()
        finally:
            if checkpointer is not None:
                checkpointer.stop()
            self._connection.close()
            self._connection = None
            loop.call_soon_threadsafe(_settle, self._ended, None)

    # The methods below run on the writer thread.

    def _commit(self, batch: list[_Pending]) -> list[Any]:
        """Run the batch in one transaction; each job's result, or its failure.
        Never raises: whatever happens, every caller gets an answer."""
        durable = any(p.durable for p in batch)
        try:
            return self._transaction([p.job for p in batch], durable=durable)
        except BaseException as error:
            # A job's own refusal (StoreUnavailable: a sender's webhook into a
            # deleted database file) is that job's, not the disk's: the alert
            # and the scheduler's writes beside it are still done.
            own = isinstance(error, StoreUnavailable)
            if len(batch) == 1 or (is_environmental(error) and not own):
                failure = _Failed(unavailable(error))
                return [failure] * len(batch)
        # One job broke the batch: run each alone so the others still land.
        results: list[Any] = []
        for pending in batch:
            try:
                results.append(self._transaction([pending.job], durable=pending.durable)[0])
            except BaseException as error:
                results.append(_Failed(unavailable(error)))
        return results

    def _transaction(self, jobs: list[Job[Any]], *, durable: bool) -> list[Any]:
        connection = self._connection
        assert connection is not None
        relaxed = not durable and self._wal
        level = min(self._synchronous, _NORMAL) if relaxed else self._synchronous
        if level != self._level:
            # Before BEGIN, on purpose: if it cannot be put back (SQLite
            # refuses inside a transaction a failed ROLLBACK left open), the
            # durable batch fails here rather than commit unsynced.
            connection.execute(f"PRAGMA synchronous = {level}")
            self._level = level
        connection.execute("BEGIN IMMEDIATE")
        try:
            results = _run_jobs(connection, jobs)
            connection.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            raise
        return results


def _settle(future: asyncio.Future[None] | None, error: BaseException | None) -> None:
    if future is None or future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _run_jobs(connection: sqlite3.Connection, jobs: list[Job[Any]]) -> list[Any]:
    """Run jobs in order; a run of jobs of one kind that can be done together
    (a `run_many` static method) is done in one call."""
    results: list[Any] = []
    index = 0
    while index < len(jobs):
        kind = type(jobs[index])
        run_many = getattr(kind, "run_many", None)
        if run_many is None:
            job = jobs[index]
            assert callable(job)  # not Batched
            results.append(job(connection))
            index += 1
            continue
        end = index + 1
        while end < len(jobs) and type(jobs[end]) is kind:
            end += 1
        results.extend(run_many(connection, jobs[index:end]))
        index = end
    return results
