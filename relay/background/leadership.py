"""Which instance of a cluster runs the singletons: retention, alert grouping,
the queue gauges and the search index.

On PostgreSQL the store decides (`Shared.lead()`: a session advisory lock,
released by the server when the holder's session ends). One task per
instance asks it every `every` seconds and keeps the answer, so the
singletons read a plain bool and never race each other on the lock's
connection. When the leader dies, another instance takes the lock at its
next check: a kill -9 costs at most `every` seconds; a leader whose host or
process hangs loses its session (and so the lock) when the server times it
out (`[storage] dead_after`).

A store of one process (SQLite) has no `lead`: that process always leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("relay.leadership")

# How often an instance asks whether it leads (and a follower tries to).
CHECK_EVERY = 1.0


class Leadership:
    def __init__(
        self,
        lead: Callable[[], Awaitable[bool]] | None,
        *,
        every: float = CHECK_EVERY,
    ) -> None:
        self._lead = lead
        self._every = every
        self.leading = lead is None
        self._on_gained: list[Callable[[], None]] = []
        self._stopped = asyncio.Event()

    @property
    def shared(self) -> bool:
        """Whether several instances compete for the lead (the store is shared)."""
        return self._lead is not None

    def on_gained(self, callback: Callable[[], None]) -> None:
        """Call `callback` each time this instance takes the lead (a singleton
        runs its work at once instead of at its next pass)."""
        self._on_gained.append(callback)

    async def check(self) -> bool:
        """Ask the store once; returns whether this instance leads now."""
        if self._lead is None:
            return True
        leading = await self._lead()
        if leading != self.leading:
            self.leading = leading
            if leading:
                log.info(
                    "leading the cluster: this instance runs retention, alerts, gauges"
                    " and the search index"
                )
                for callback in self._on_gained:
                    callback()
            else:
                # Also when the database itself went away: then nobody leads
                # until it is back, and the line must not say someone does.
                log.warning(
                    "no longer leading the cluster: the lead goes to the instance that"
                    " takes the database's lead lock (none while the database is away)"
                )
        return leading

    async def run(self) -> None:
        """Check every `every` seconds until stopped."""
        while not self._stopped.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self._every)

    def stop(self) -> None:
        self._stopped.set()
