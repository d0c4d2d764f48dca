"""The search indexer: fills the content index in the background, never in a request.

Ingress stores an event and answers; it never waits for the index. This task
follows behind: it reads the oldest events not yet indexed, turns them into
search text on a worker thread (decoding a body is CPU work the event loop
must not do), and writes a batch together with the new high-water mark in one
transaction — so after a crash it simply goes on from the mark. It gives way
to ingest: while webhooks are arriving it waits for a quiet moment (up to
MAX_DEFER, then it takes a small slice), and after each batch it rests as
long as the batch took, so it takes at most about half of the writer's time
even when far behind.
"""

from __future__ import annotations

import asyncio
import logging

from relay.clock import Clock
from relay.config import Config
from relay.search import MAX_BODY_BYTES, documents
from relay.secrets import Masker
from relay.store import Indexing, StoreError

log = logging.getLogger("relay.indexer")

BATCH = 200
# With nothing to do, look again this often (the CLI's resends, a restore).
IDLE_INTERVAL = 5.0
# After a wake-up, let a burst of webhooks gather into one batch.
SETTLE = 0.25
# Ingest counts as busy when a webhook arrived this recently...
QUIET = 0.05
# ...but the index is never held back longer than this: under a sustained
# flood it indexes a slice of BUSY_BATCH events every MAX_DEFER, 40 a second.
# Small slices, often, because each one stalls ingest while it lasts: making
# the search text costs ~150-300 us of CPU an event on a worker thread that
# holds the GIL (the event loop waits for it in 5 ms turns), and the write
# ~0.2 ms an event on the writer, which every sender's commit waits behind.
# One batch of 200 every 5 s was 30-60 ms of text and 30-66 ms of writing at
# once; a slice of 20 is ~6 ms and ~5 ms. 64 connections, bench/stages.py,
# one sitting: p99 18.4 -> 15.0 ms, the rate unchanged. (A lone sender's p99
# by wrk did not move measurably: its tail has another cause.)
MAX_DEFER = 0.5
BUSY_BATCH = 20
RETRY_AFTER_ERROR = 5.0


class SearchIndexer:
    def __init__(
        self,
        store: Indexing,
        clock: Clock,
        masker: Masker,
        *,
        batch: int = BATCH,
    ) -> None:
        self._store = store
        self._clock = clock
        self._masker = masker
        self._batch = batch
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._arrived = False  # a webhook came since the indexer last looked
        self.indexed = 0

    def reconfigure(self, config: Config) -> None:
        """Mask this config's secrets in what is indexed from now on."""
        self._masker = config.masker

    def noticed(self) -> None:
        """A webhook was stored: index it soon, but not while more keep coming.

        Called for every webhook, so it only raises a flag and sets an event."""
        self._arrived = True
        self._wake.set()

    async def step(self, limit: int | None = None) -> int:
        """Index the next batch (of `limit` events, else the configured batch);
        returns how many events it covered."""
        batch = await self._store.events_to_index(limit or self._batch, MAX_BODY_BYTES)
        if not batch:
            return 0
        found = await asyncio.to_thread(documents, batch, self._masker)
        await self._store.index_events(found, batch[-1].event_id)
        self.indexed += len(batch)
        return len(batch)

    async def catch_up(self) -> int:
        """Index everything stored so far (tests, benchmarks, `relay` tools)."""
        total = 0
        while count := await self.step():
            total += count
        return total

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            limit = self._batch if await self._quiet_moment(loop) else min(self._batch, BUSY_BATCH)
            started = loop.time()
            try:
                count = await self.step(limit)
            except StoreError as error:
                log.warning("search indexing failed, will try again: %s", error)
                await self._sleep(RETRY_AFTER_ERROR)
                continue
            if count == limit:
                await self._sleep(loop.time() - started)  # behind: rest as long as we worked
                continue
            self._wake.clear()
            await self._clock.wait(self._wake, self._clock.now() + IDLE_INTERVAL)
            if self._wake.is_set() and not self._stop.is_set():
                await self._sleep(SETTLE)

    async def _quiet_moment(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait for QUIET seconds without a webhook (MAX_DEFER at most); at once
        when none came since the last look. False when webhooks kept coming."""
        deferred = loop.time()
        while self._arrived:
            if loop.time() - deferred >= MAX_DEFER:
                return False
            self._arrived = False
            await self._sleep(QUIET)
        return True

    async def _sleep(self, seconds: float) -> None:
        # Real time, on purpose: this paces work against live traffic.
        if seconds > 0 and not self._stop.is_set():
            try:
                async with asyncio.timeout(seconds):
                    await self._stop.wait()
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
