"""Retention: remove finished events past their time, in small batches.

Each batch is one short write transaction, so webhooks arriving meanwhile
wait at most one batch. Pending and dead deliveries are never removed: the
store's purge only takes events whose every delivery is delivered or skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from relay.config import Config
from relay.core.clock import Clock
from relay.store import Maintenance, StoreError

log = logging.getLogger("relay.retention")

BATCH = 500
# How often the daemon looks for expired events.
INTERVAL = 600.0


def dedup_windows(config: Config) -> dict[str, float | None]:
    return {route.name: route.dedup_window for route in config.routes.values()}


def cutoffs(
    retention: float, windows: Mapping[str, float | None], now: float
) -> tuple[dict[str, float], float]:
    """Per-route cutoffs (routes keeping events longer for de-duplication), and the default."""
    routes = {
        route: now - window
        for route, window in windows.items()
        if window is not None and window > retention
    }
    return routes, now - retention


async def purge(
    store: Maintenance,
    retention: float,
    windows: Mapping[str, float | None],
    now: float,
    *,
    dry_run: bool = False,
) -> int:
    """Remove (or, dry, count) every finished event past retention; returns how many."""
    route_cutoffs, default_cutoff = cutoffs(retention, windows, now)
    if dry_run:
        return await store.purge(route_cutoffs, default_cutoff, limit=0, dry_run=True)
    total = 0
    while True:
        removed = await store.purge(route_cutoffs, default_cutoff, limit=BATCH, dry_run=False)
        total += removed
        if removed < BATCH:
            break
    # Each step is its own short commit: webhooks arriving meanwhile share them.
    while total and await store.reclaim_space():
        pass
    return total


class RetentionJob:
    def __init__(
        self,
        store: Maintenance,
        config: Config,
        clock: Clock,
        on_purged: Callable[[int], None],
        *,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        # Several instances on one database: only the leading one purges.
        self._leading = leading
        self.config = config
        self._clock = clock
        # Told how many events each pass removed (relay_purged_events_total).
        self._on_purged = on_purged
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    def reconfigure(self, config: Config) -> None:
        self.config = config

    async def run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # a lead taken before this pass needs no other
            if self._leading():
                await self.run_once()
            await self._clock.wait(self._wake, self._clock.now() + INTERVAL)

    def wake(self) -> None:
        """Run a pass now: this instance has just taken the lead (the one that
        led may have died just before its pass)."""
        self._wake.set()

    async def run_once(self) -> int:
        """One pass: the finished events past their time removed; how many."""
        try:
            removed = await purge(
                self.store,
                self.config.storage.retention,
                dedup_windows(self.config),
                self._clock.now(),
            )
        except StoreError as error:
            log.warning("retention pass failed, will try again: %s", error)
            return 0
        if removed:
            self._on_purged(removed)
            log.info("retention removed %d finished events", removed)
        return removed

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
