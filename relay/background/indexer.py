"""The search indexer: fills the content index in the background, never in a request.

Ingress stores an event and answers; it never waits for the index. This task
follows behind: it reads the oldest events not yet indexed, turns them into
search text on a worker thread (decoding a body is CPU work the event loop
must not do), and writes it a few events at a time, each piece together with
its new high-water mark in one transaction — so after a crash it simply goes
on from the mark. It gives way to ingest: no piece of its work holds a
webhook up for long (CHUNK); while webhooks are arriving it waits for a quiet
moment (up to MAX_DEFER, then it does one piece; longer, up to FLOOD_DEFER,
when they come faster than it could keep pace with); and after each batch it
rests as long as the batch took, so it takes at most about half of the
writer's time even when far behind.

On a cluster the index is shared, so one instance fills it: the one leading.
The others would only race it over the same events, each making their text
again and writing it twice. When the lead moves, the new leader goes on from
the mark the last one wrote. There the store has no single writer that
ingest waits behind (each write has a connection of its own), so the leader
neither waits for quiet moments nor cuts a batch into pieces: it follows the
whole cluster's webhooks as they come, resting after each batch as long as
it took.

A stored event cannot stop relay through it. Its work on an event is linear
(relay.ops.search; tests/unit/test_patterns.py), and the store is told what
it is on before it reads (`indexing_begins`: the batch's last event), so a
process that dies there, killed by the watchdog or a bug not found yet, is
known at the next start: that start reads what was left one event at a time,
each said before it is read, and an event it was on alone when relay
stopped is skipped, flagged on the event (shown on its page, in the
Overview, `relay_events_flagged`) and alerted (`on_flagged`), never read
again by the index. One crash more at most; never a loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from relay.config import Config
from relay.core.clock import Clock
from relay.core.outage_log import OutageLog
from relay.core.secrets import Masker
from relay.core.units import format_duration
from relay.ops.search import MAX_BODY_BYTES, documents
from relay.store import Indexing, StoreError

log = logging.getLogger("relay.indexer")

# Events read at once: ~10 pieces. A catch-up that gives way to a webhook
# reads the rest again later, so a large read would mostly be read twice.
BATCH = 40
# The unit of work: the search text of CHUNK events, made on a worker thread,
# then written in one job on the writer. Each piece holds up a webhook that
# arrives meanwhile by its whole length (the worker thread holds the GIL, and
# the writer commits one job after another), so a piece is kept under a
# millisecond each way, whatever the indexer is doing: catching up after a
# restart or a flood, or keeping pace amid one. Smaller pieces would cost
# more an event to catch up.
CHUNK = 4
# With nothing to do, look again this often (the CLI's resends, a restore).
IDLE_INTERVAL = 5.0
# After a wake-up, let a burst of webhooks gather into one batch.
SETTLE = 0.25
# Ingest counts as busy when a webhook arrived this recently...
QUIET = 0.05
# ...but the index is never held back longer than this while it can keep
# pace: amid webhooks coming at most CHUNK every MAX_DEFER (nearly 40 a
# second, less the pieces' own time) it indexes one piece every MAX_DEFER,
# and so follows them as they come.
MAX_DEFER = 0.1
# Amid faster ones it cannot keep pace (catching up waits for the quiet after
# them, when it runs without pauses), and each piece holds up the webhook it
# meets (the read, the text, the write): often enough to set a lone sender's
# p99. So the wait grows with their rate: twice the rate it can follow, twice
# MAX_DEFER, and so on up to this: the index still moves on amid a flood that
# never ends, and meets a sender twice a second.
FLOOD_DEFER = 0.5
RETRY_AFTER_ERROR = 5.0
# Why an event is left out of the index (relay show, the event page).
SKIPPED = (
    "the search indexer was reading it when relay stopped (a crash or a kill):"
    " left out of the search index so it cannot stop relay again; its deliveries"
    " go on as before"
)


class SearchIndexer:
    def __init__(
        self,
        store: Indexing,
        clock: Clock,
        masker: Masker,
        *,
        batch: int = BATCH,
        chunk: int = CHUNK,
        retry_after_error: float = RETRY_AFTER_ERROR,
        leading: Callable[[], bool] = lambda: True,
        one_writer: bool = True,
        on_flagged: Callable[[int], None] | None = None,
    ) -> None:
        """`one_writer`: the store writes the index through the writer that
        stores webhooks (SQLite), so the index gives way to them."""
        self._store = store
        self._leading = leading
        self._clock = clock
        self._masker = masker
        self._batch = batch
        self._chunk = chunk if one_writer else batch
        self._gives_way = one_writer
        self._retry_after_error = retry_after_error
        self._wake = asyncio.Event()
        self._lead_taken = asyncio.Event()
        self._stop = asyncio.Event()
        self._arrived = False  # a webhook came since the indexer last looked
        self._arrivals = 0  # webhooks noticed so far
        self._failing = OutageLog()  # the store refusing the index's reads or writes
        self._on_flagged = on_flagged
        # Whether what a stopped process was on is still to be looked at (at
        # each start, and each time the lead is taken), and the last event
        # of it, read one at a time.
        self._look_back = True
        self._careful_through: int | None = None
        self.indexed = 0

    def reconfigure(self, config: Config) -> None:
        """Mask this config's secrets in what is indexed from now on."""
        self._masker = config.masker

    def noticed(self) -> None:
        """A webhook was stored: index it soon, but not while more keep coming.

        Called for every webhook, so it only counts, raises a flag and sets an event."""
        self._arrived = True
        self._arrivals += 1
        self._wake.set()

    async def step(self, limit: int | None = None, *, give_way: bool = False) -> int:
        """Index the next batch (of `limit` events, else the configured batch),
        piece by piece (see CHUNK); returns how many events it covered. With
        `give_way`, stop after the piece during which a webhook arrived; on
        stop(), after the piece under way."""
        batch = await self._store.events_to_index(limit or self._batch, MAX_BODY_BYTES)
        if not batch:
            return 0
        if self._look_back:
            self._look_back = False
            await self._looked_back(batch[0].event_id)
            batch = await self._store.events_to_index(limit or self._batch, MAX_BODY_BYTES)
            if not batch:
                return 1
        careful = self._careful_through
        if careful is not None and batch[0].event_id > careful:
            careful = self._careful_through = None
        chunk = 1 if careful is not None else self._chunk
        if careful is None:
            await self._store.indexing_begins(batch[-1].event_id)
        done = 0
        while done < len(batch):
            if done and (self._stop.is_set() or (give_way and self._arrived)):
                if self._stop.is_set():
                    # A stop between pieces: on none, nothing to look back at.
                    await self._store.indexing_begins(None)
                break
            piece = batch[done : done + chunk]
            if careful is not None:
                if piece[0].event_id > careful:
                    break
                await self._store.indexing_begins(piece[0].event_id)
            found = await asyncio.to_thread(documents, piece, self._masker)
            # Each piece is written with its own mark: a crash between pieces
            # loses nothing, the next start goes on after the last one written.
            await self._store.index_events(found, piece[-1].event_id)
            self.indexed += len(piece)
            done += len(piece)
        return done

    async def _looked_back(self, first: int) -> None:
        """What the last process was on when it stopped: an event alone is
        skipped and flagged; more are read one at a time (`first`: the first
        event not indexed)."""
        through = await self._store.interrupted_indexing()
        if through is None:
            return
        if through == first:
            await self._store.skip_indexing(first, SKIPPED)
            log.error(
                "event %d: relay stopped while the search indexer read it; it is"
                " left out of the search index and flagged (relay show %d)",
                first,
                first,
            )
            if self._on_flagged is not None:
                self._on_flagged(first)
            return
        self._careful_through = through

    async def catch_up(self) -> int:
        """Index everything stored so far (tests, benchmarks, `relay` tools)."""
        total = 0
        while count := await self.step():
            total += count
        return total

    def lead_taken(self) -> None:
        """This instance has just taken the cluster's lead: index from now on,
        after a look at what the last leader was on."""
        self._look_back = True
        self._lead_taken.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            if not self._leading():
                # A failure while it led is no longer its to report: once it
                # leads again, its first batch says nothing of "again".
                self._failing.ended(self._clock.now())
                # Waits for the lead, not for webhooks: every one sets the wake.
                self._lead_taken.clear()
                await self._clock.wait(self._lead_taken, self._clock.now() + IDLE_INTERVAL)
                continue
            if self._gives_way:
                limit = self._batch if await self._quiet_moment(loop) else self._chunk
            else:
                self._arrived = False  # one that comes after this read wakes it again
                limit = self._batch
            if self._stop.is_set():
                return
            started = loop.time()
            try:
                count = await self.step(limit, give_way=self._gives_way)
            except StoreError as error:
                if self._failing.failed(self._clock.now()):
                    log.warning("search indexing failed, will try again: %s", error)
                await self._sleep(self._retry_after_error)
                continue
            lasted = self._failing.ended(self._clock.now())
            if lasted is not None:
                log.warning("search indexing works again, after %s", format_duration(lasted))
            if count == limit:
                await self._sleep(loop.time() - started)  # behind: rest as long as we worked
                continue
            if self._arrived:
                # It gave way to a webhook, or one came as it found nothing
                # left (its read missed that commit): on at the next quiet
                # moment, not at the next idle look. Never a busy loop:
                # _quiet_moment sleeps while webhooks come; without it, the
                # cluster's next webhooks gather into a batch meanwhile.
                if not self._gives_way:
                    await self._sleep(MAX_DEFER)
                continue
            self._wake.clear()
            if self._stop.is_set():  # stop() set the wake just cleared
                return
            await self._clock.wait(self._wake, self._clock.now() + IDLE_INTERVAL)
            if self._wake.is_set() and not self._stop.is_set():
                await self._sleep(SETTLE)

    async def _quiet_moment(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait for QUIET seconds without a webhook: MAX_DEFER at most, or
        longer in proportion while they come faster than a piece every
        MAX_DEFER could follow (FLOOD_DEFER at most); at once when none came
        since the last look. False when webhooks kept coming."""
        deferred, arrivals = loop.time(), self._arrivals
        while self._arrived:
            waited = loop.time() - deferred
            if waited >= MAX_DEFER:
                # How many times faster they come than pieces every MAX_DEFER follow.
                faster = (self._arrivals - arrivals) * MAX_DEFER / (self._chunk * waited)
                if waited >= min(MAX_DEFER * max(1.0, faster), FLOOD_DEFER):
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
        self._lead_taken.set()
