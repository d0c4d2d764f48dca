"""Memory given back once relay is quiet.

After a burst SQLite keeps each connection's page cache full, and the C
allocator keeps the pages Python and SQLite freed. Neither is of use while
nothing arrives, which on a small VPS is most of the day: relay after a
burst held megabytes more than before it. Once no webhook has arrived and no
attempt has been made for `quiet` seconds (the store's own writes are no
measure: the scheduler reads it every second and may write), relay
asks for both back, once per quiet spell. The first webhook afterwards
reads its pages again from the operating system's file cache: microseconds,
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Awaitable, Callable

from relay.store import Maintenance, StoreError

log = logging.getLogger("relay.memory")

QUIET_SECONDS = 10.0
CHECK_SECONDS = 5.0
# Request bodies held at once past which, once they are gone, the allocator
# is trimmed at the next look even while webhooks keep coming: a burst of
# stalled uploads (up to ingress's BODIES_IN_FLIGHT, 64 MiB) is not kept
# until a quiet spell that a busy relay never has.
BODY_TRIM_BYTES = 16 * 1024 * 1024


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


class MemoryRelease:
    def __init__(
        self,
        store: Maintenance,
        activity: Callable[[], float],
        *,
        quiet: float = QUIET_SECONDS,
        every: float = CHECK_SECONDS,
        bodies: Callable[[], tuple[int, int]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[asyncio.Event, float], Awaitable[None]] = _wait,
    ) -> None:
        """`activity` only grows while relay works (webhooks received and
        attempts made, relay.ops.metrics); `bodies` gives (held now, most held
        since the last call) of request bodies being received. Time is
        monotonic (a wall clock stepped back must not put the release off);
        `wait(event, seconds)` returns when the event is set or the seconds
        have passed (tests pass their own, with `monotonic`)."""
        self._store = store
        self._activity = activity
        self._bodies = bodies
        self.trims = 0  # allocator trims after a burst of bodies, quiet or not
        self._quiet = quiet
        self._every = every
        self._monotonic = monotonic
        self._wait = wait
        self._stopped = asyncio.Event()
        self.releases = 0  # quiet spells whose memory was given back

    async def run(self) -> None:
        seen = self._activity()
        quiet_since = self._monotonic()
        released = False
        while not self._stopped.is_set():
            await self._wait(self._stopped, self._every)
            now = self._monotonic()
            self._after_bodies()
            if self._activity() != seen:
                seen, quiet_since, released = self._activity(), now, False
            elif not released and now - quiet_since >= self._quiet:
                try:
                    await self._store.release_memory()
                except StoreError as error:  # the next quiet spell tries again
                    log.debug("memory not released: %s", error)
                # Cycles left by the burst: the collector's threshold (relay.app)
                # is set for busy times and is not reached while quiet.
                gc.collect()
                trim_allocator()
                released = True
                self.releases += 1

    def _after_bodies(self) -> None:
        if self._bodies is None:
            return
        held, peak = self._bodies()
        if peak >= BODY_TRIM_BYTES and held < peak // 4:
            trim_allocator()
            self.trims += 1

    def stop(self) -> None:
        self._stopped.set()


def trim_allocator() -> None:
    """Give the C allocator's free pages back to the system: glibc keeps what
    was freed in its arenas (malloc_trim). Other C libraries: nothing done."""
    import ctypes  # only here: a quarter of a MiB that only this needs

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
