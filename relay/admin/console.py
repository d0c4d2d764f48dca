"""`Console`: what the API, metrics and dashboard can reach and do, as one object:
the actions a person may take (`relay.ops.actions`, shared with the CLI) and the
running daemon's side of them (the scheduler acts at once, metrics re-read)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from relay.config import Config, StorageConfig
from relay.core.secrets import Masker
from relay.delivery.retry import describe_schedule
from relay.delivery.scheduler import Scheduler
from relay.ops.actions import Actions
from relay.ops.metrics import Metrics, StoreSnapshot
from relay.ops.views import target_view
from relay.store import (
    Health,
    Operations,
    Queries,
    Rhythms,
    Status,
)

# /metrics reads the store at most this often, however often it is scraped.
SNAPSHOT_TTL = 5.0


class ConsoleStore(Operations, Queries, Health, Rhythms, Protocol):
    """What the API and the dashboard use: they read, act on deliveries and
    targets, and /readyz proves the store writable; and what the silence
    watch says of the routes."""


def _free_bytes(storage: StorageConfig) -> int | None:
    """Room left for the SQLite database (and its -wal) to grow; a full disk
    turns every webhook into a 503."""
    if storage.url is not None:
        return None
    try:
        found = os.statvfs(storage.path.resolve().parent)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


@dataclass
class Console(Actions):
    store: ConsoleStore
    current_config: Callable[[], Config]
    scheduler: Scheduler
    metrics: Metrics
    store_stats: Callable[[], tuple[int, int]] = lambda: (0, 0)
    # Whether this instance exports the queue gauges: on a cluster, only the
    # leading instance reads them (see Metrics.set_leading).
    leading: Callable[[], bool] = lambda: True
    # Routes and targets failing now, as the alerter counts them: (route,
    # target) -> (failed attempts in a row, the last error).
    route_health: Callable[[], Mapping[tuple[str, str], tuple[int, str]]] = lambda: {}
    _snapshot_at: float = field(default=float("-inf"))

    @property
    def config(self) -> Config:
        return self.current_config()

    @property
    def masker(self) -> Masker:
        return self.config.masker

    async def refresh_metrics(self) -> None:
        commits, writes = self.store_stats()
        self.metrics.commits.set_total(commits)
        self.metrics.committed_writes.set_total(writes)
        leading = self.leading()
        self.metrics.set_leading(leading)
        if not leading:
            # The cluster's queue gauges come from the leading instance alone,
            # so that a sum over every scraped instance counts each delivery once.
            self.metrics.set_snapshot(None)
            self._snapshot_at = float("-inf")
            return
        if time.monotonic() - self._snapshot_at < SNAPSHOT_TTL:
            return
        config = self.config
        gauges = await self.store.gauges()
        targets = await self.store.target_states()
        progress = await self.store.search_progress()
        failing = await self.store.failing_deliveries(config.alerts.delivery_failing_after, 0)
        watches = await self.store.route_watches()
        self.metrics.set_snapshot(
            StoreSnapshot(
                gauges=gauges,
                targets=targets,
                paused=self.scheduler.paused,
                configured=tuple(config.targets),
                now=self.clock.now(),
                index_behind=progress.behind,
                free_bytes=_free_bytes(config.storage),
                failing=failing.counts,
                routes={name: watches.routes.get(name) for name in config.routes},
                pairs=tuple(
                    (route.name, entry.target)
                    for route in config.routes.values()
                    for entry in route.targets
                ),
            )
        )
        self._snapshot_at = time.monotonic()

    def changed(self) -> None:
        """An operator changed the store: metrics re-read it, the scheduler looks again."""
        self._snapshot_at = float("-inf")
        self.scheduler.targets_changed()

    async def target_views(self) -> list[dict[str, Any]]:
        """Every configured target: settings (secrets masked), schedule, pause, health, counts."""
        config = self.config
        masker = self.masker
        states = await self.store.target_states()
        gauges = await self.store.gauges()
        statuses = (Status.PENDING, Status.IN_FLIGHT, Status.DEAD)
        return [
            target_view(
                target,
                states.get(name),
                paused=name in self.scheduler.paused,
                counts={s.value: gauges.counts.get((name, s), 0) for s in statuses},
                schedule=describe_schedule(target.retry),
                masker=masker,
            )
            for name, target in config.targets.items()
        ]


CONSOLE = web.AppKey("console", Console)
