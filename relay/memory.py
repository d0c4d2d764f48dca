"""Memory given back once relay is quiet.

After a burst SQLite keeps each connection's page cache full, and the C
allocator keeps the pages Python and SQLite freed. Neither is of use while
nothing arrives, which on a small VPS is most of the day: relay after a
burst held ~6 MiB more than before it. Once no webhook has arrived and no
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
from collections.abc import Callable

from relay.store import Maintenance, StoreError

log = logging.getLogger("relay.memory")

QUIET_SECONDS = 10.0
CHECK_SECONDS = 5.0


class MemoryRelease:
    def __init__(
        self,
        store: Maintenance,
        activity: Callable[[], float],
        *,
        quiet: float = QUIET_SECONDS,
        every: float = CHECK_SECONDS,
    ) -> None:
        """`activity` only grows while relay works (webhooks received and
        attempts made, relay.metrics)."""
        self._store = store
        self._activity = activity
        self._quiet = quiet
        self._every = every
        self._stopped = asyncio.Event()
        self.releases = 0  # quiet spells whose memory was given back

    async def run(self) -> None:
        seen = self._activity()
        quiet_since = time.monotonic()
        released = False
        while not self._stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self._every)
            now = time.monotonic()
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

    def stop(self) -> None:
        self._stopped.set()


def trim_allocator() -> None:
    """Give the C allocator's free pages back to the system: glibc keeps what
    was freed in its arenas (malloc_trim). Other C libraries: nothing done."""
    import ctypes  # only here: a quarter of a MiB that only this needs

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
