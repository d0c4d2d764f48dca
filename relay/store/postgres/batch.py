"""Group commit on PostgreSQL: concurrent writes of one kind share a transaction.

Callers hand in a job; one task takes every job waiting, runs them in one
transaction, commits, and only then answers each caller with its own result.
The answer comes from the very transaction that held the write: if that
commit fails, or its outcome is unknown because the connection broke, every
job in it gets the error, never a result. A job that breaks the batch (not
the database going away) is found by running each alone, so the others
still land.

Per write, the database's work is then its statements, not a transaction:
one commit (one WAL flush, one lock round) for the whole batch, and a row
that every write locks (a target's health) is locked once per batch rather
than once per write, each waiting for the previous one's commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import asyncpg

from relay.store.base import StoreUnavailable
from relay.store.postgres.errors import Connection, is_environmental, unavailable

log = logging.getLogger("relay.store")

J = TypeVar("J")
R = TypeVar("R")

# Runs a batch in the caller's transaction: one result per job, in order.
Run = Callable[[Connection, Sequence[J]], Awaitable[list[R]]]


@dataclass(eq=False)
class _Waiting(Generic[J, R]):
    job: J
    future: asyncio.Future[R]
    deadline: float
    taken: bool = field(default=False)


class GroupCommit(Generic[J, R]):
    """One batching task; `submit` returns a future settled after the commit."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        run: Run[J, R],
        *,
        what: str,
        queue_timeout: float | None = None,
        max_batch: int = 500,
        committed: Callable[[], None] | None = None,
    ) -> None:
        self._pool = pool
        self._run_batch = run
        self._what = what  # for the log: "storing a batch of 3 <what>"
        self._queue_timeout = queue_timeout
        self._max_batch = max_batch
        self._committed = committed  # told after each batch that committed
        self._queue: list[_Waiting[J, R]] = []
        self._has_work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0
        self.jobs = 0

    def start(self, name: str) -> None:
        self._task = asyncio.create_task(self._run(), name=name)

    async def close(self) -> None:
        self._closing = True
        self._has_work.set()
        if self._task is not None:
            await self._task

    def submit(self, job: J) -> asyncio.Future[R]:
        """Queue `job` for the next group transaction; the future has its outcome."""
        if self._closing or self._task is None:
            raise StoreUnavailable("store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        deadline = loop.time() + self._queue_timeout if self._queue_timeout else float("inf")
        self._queue.append(_Waiting(job, future, deadline))
        self._has_work.set()
        return future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._has_work.wait()
            self._has_work.clear()
            now = loop.time()
            batch: list[_Waiting[J, R]] = []
            for waiting in self._queue[: self._max_batch]:
                if waiting.future.done():
                    continue
                if now >= waiting.deadline:
                    waiting.future.set_exception(
                        StoreUnavailable("no write slot in time: the database is slow or away")
                    )
                    continue
                batch.append(waiting)
            del self._queue[: self._max_batch]
            if self._queue:
                self._has_work.set()
            if not batch:
                if self._closing and not self._queue:
                    return
                continue
            for waiting in batch:
                waiting.taken = True
            results = await self._commit([w.job for w in batch])
            self.batches += 1
            self.jobs += len(batch)
            if self._committed is not None and not all(
                isinstance(result, BaseException) for result in results
            ):
                self._committed()
            for waiting, result in zip(batch, results, strict=True):
                if waiting.future.done():
                    continue
                if isinstance(result, BaseException):
                    waiting.future.set_exception(result)
                else:
                    waiting.future.set_result(result)

    async def _commit(self, jobs: list[J]) -> list[R | BaseException]:
        try:
            return list(await self._transaction(jobs))
        except Exception as error:
            if len(jobs) == 1 or is_environmental(error):
                failure = unavailable(error)
                if not isinstance(failure, StoreUnavailable):
                    log.error("storing a batch of %d %s failed: %s", len(jobs), self._what, error)
                return [failure] * len(jobs)
        # One job broke the batch: each alone, so the others still land.
        results: list[R | BaseException] = []
        for job in jobs:
            try:
                results.extend(await self._transaction([job]))
            except Exception as error:
                results.append(unavailable(error))
        return results

    async def _transaction(self, jobs: Sequence[J]) -> list[R]:
        async with self._pool.acquire() as connection:
            try:
                async with connection.transaction():
                    return await self._run_batch(connection, jobs)
            except asyncpg.exceptions.InternalClientError:
                connection.terminate()  # its protocol state is unknown: not to be lent again
                raise
