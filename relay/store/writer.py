"""Group commit: one thread owns the write connection; many callers share a commit.

Callers hand in a job (a function of the connection). The writer takes every
job waiting, runs them in one transaction on its own thread, commits (one
fsync), and only then answers each caller with its own job's result. A
caller's answer therefore always comes from the very transaction that held
its rows: if that commit fails, every job in it fails, and nobody is told
"stored" for a row that is not on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relay.store.base import StoreError, StoreUnavailable

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], T]

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
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _ENVIRONMENTAL


def unavailable(error: BaseException) -> StoreError:
    """A driver error as the store's own; the message says what the disk said."""
    if isinstance(error, StoreError):
        return error
    if is_environmental(error):
        return StoreUnavailable(f"database cannot be written: {error}")
    return StoreError(f"database error: {error}")


@dataclass(eq=False)
class _Pending:
    job: Job[Any]
    future: asyncio.Future[Any]
    deadline: float  # loop time after which, still untaken, the job gives up
    taken: bool = field(default=False)


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class GroupCommitWriter:
    def __init__(self, connect: Callable[[], sqlite3.Connection], *, max_batch: int = 1000) -> None:
        self._connect = connect
        self._max_batch = max_batch
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="relay-writer")
        self._connection: sqlite3.Connection | None = None
        self._queue: list[_Pending] = []
        self._has_work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closing = False
        # Counters for metrics and benchmarks: batches committed, jobs in them.
        self.batches = 0
        self.jobs = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._connection = await loop.run_in_executor(self._executor, self._connect)
        self._task = asyncio.create_task(self._run(), name="relay-writer")

    async def run(self, job: Job[T], *, queue_timeout: float | None = None) -> T:
        """Run `job` in the next group transaction and return its result after the commit."""
        return await self.submit(job, queue_timeout=queue_timeout)

    def submit(self, job: Job[T], *, queue_timeout: float | None = None) -> asyncio.Future[T]:
        """Queue `job` for the next group transaction: the future has its result
        after the commit (ingress answers from it without a task per request).

        `queue_timeout` bounds the wait for a place in a transaction; once the
        job is in one, its outcome is awaited whatever it takes (the
        connection's busy timeout bounds that), because giving up then could
        answer "failed" for a row that is in fact committed.
        """
        if self._closing or self._task is None:
            raise StoreUnavailable("store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        deadline = loop.time() + queue_timeout if queue_timeout is not None else float("inf")
        self._queue.append(_Pending(job, future, deadline))
        self._has_work.set()
        if queue_timeout is not None and self._sweeper is None:
            # One timer for the whole queue, not one per request: at thousands
            # of webhooks a second a timer each costs more than the commit.
            self._sweeper = loop.call_later(queue_timeout / 2, self._sweep, queue_timeout / 2)
        return future

    def _sweep(self, every: float) -> None:
        """Fail the jobs that waited past their deadline without joining a transaction."""
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        for pending in self._queue:
            if not pending.taken and not pending.future.done() and now >= pending.deadline:
                waited = every * 2
                pending.future.set_exception(
                    StoreUnavailable(f"no write slot within {waited:g}s: the database is busy")
                )
        if self._queue:
            self._sweeper = asyncio.get_running_loop().call_later(every, self._sweep, every)

    async def close(self) -> None:
        """Commit what is queued, then close the connection and the thread."""
        self._closing = True
        self._has_work.set()
        if self._task is not None:
            await self._task
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._connection is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._connection.close)
            self._connection = None
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                # Closing ends the loop only once the queue is empty: close()
                # wakes it once, and that wake-up may be spent on a last batch
                # (an attempt recorded while relay stops), after which waiting
                # for another one would hang the shutdown for good.
                if self._closing:
                    return
                await self._has_work.wait()
                self._has_work.clear()
                continue
            batch = [p for p in self._queue[: self._max_batch] if not p.future.done()]
            del self._queue[: self._max_batch]
            if not batch:
                continue
            for pending in batch:
                pending.taken = True
            results = await loop.run_in_executor(self._executor, self._commit, batch)
            self.batches += 1
            self.jobs += len(batch)
            for pending, result in zip(batch, results, strict=True):
                if pending.future.done():
                    continue
                if isinstance(result, _Failed):
                    pending.future.set_exception(result.error)
                else:
                    pending.future.set_result(result)

    # The methods below run on the writer thread.

    def _commit(self, batch: list[_Pending]) -> list[Any]:
        try:
            return self._transaction([p.job for p in batch])
        except BaseException as error:
            if len(batch) == 1 or is_environmental(error):
                failure = _Failed(unavailable(error))
                return [failure] * len(batch)
        # One job broke the batch: run each alone so the others still land.
        results: list[Any] = []
        for pending in batch:
            try:
                results.append(self._transaction([pending.job])[0])
            except BaseException as error:
                results.append(_Failed(unavailable(error)))
        return results

    def _transaction(self, jobs: list[Job[Any]]) -> list[Any]:
        connection = self._connection
        assert connection is not None
        connection.execute("BEGIN IMMEDIATE")
        try:
            results = _run_jobs(connection, jobs)
            connection.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            raise
        return results


def _run_jobs(connection: sqlite3.Connection, jobs: list[Job[Any]]) -> list[Any]:
    """Run jobs in order; a run of jobs of one kind that can be done together
    (a `run_many` static method) is done in one call."""
    results: list[Any] = []
    index = 0
    while index < len(jobs):
        kind = type(jobs[index])
        run_many = getattr(kind, "run_many", None)
        if run_many is None:
            results.append(jobs[index](connection))
            index += 1
            continue
        end = index + 1
        while end < len(jobs) and type(jobs[end]) is kind:
            end += 1
        results.extend(run_many(connection, jobs[index:end]))
        index = end
    return results
