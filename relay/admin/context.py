"""What the operator surface (API, metrics, dashboard) can reach, as one typed object."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from relay.clock import Clock
from relay.config import Config
from relay.metrics import Metrics, StoreSnapshot
from relay.scheduler import Scheduler
from relay.secrets import Masker
from relay.store import Store

# /metrics reads the store at most this often, however often it is scraped.
SNAPSHOT_TTL = 5.0


@dataclass
class Operator:
    store: Store
    scheduler: Scheduler
    clock: Clock
    metrics: Metrics
    current_config: Callable[[], Config]
    store_stats: Callable[[], tuple[int, int]] = lambda: (0, 0)
    _snapshot_at: float = field(default=float("-inf"))

    @property
    def config(self) -> Config:
        return self.current_config()

    @property
    def masker(self) -> Masker:
        return Masker(self.config.secrets)

    async def refresh_metrics(self) -> None:
        if time.monotonic() - self._snapshot_at < SNAPSHOT_TTL:
            return
        gauges = await self.store.gauges()
        targets = await self.store.target_states()
        self.metrics.set_snapshot(
            StoreSnapshot(
                gauges=gauges,
                targets=targets,
                paused=self.scheduler.paused,
                configured=tuple(self.config.targets),
                now=self.clock.now(),
            )
        )
        commits, writes = self.store_stats()
        self.metrics.commits.set(commits)
        self.metrics.committed_writes.set(writes)
        self._snapshot_at = time.monotonic()

    def changed(self) -> None:
        """An operator changed the store: metrics re-read it, the scheduler looks again."""
        self._snapshot_at = float("-inf")
        self.scheduler.targets_changed()


OPERATOR = web.AppKey("operator", Operator)
