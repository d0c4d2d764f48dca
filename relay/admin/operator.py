"""`Operator`: what the API, metrics and dashboard can reach and do, as one object."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from relay.clock import Clock
from relay.config import Config
from relay.metrics import Metrics, StoreSnapshot
from relay.retry import describe_schedule
from relay.scheduler import Scheduler
from relay.secrets import Masker
from relay.store import (
    DeliveryView,
    Health,
    NotFound,
    Operations,
    Queries,
    Resend,
    Selection,
    Status,
)
from relay.views import target_view

# /metrics reads the store at most this often, however often it is scraped.
SNAPSHOT_TTL = 5.0


class ConsoleStore(Operations, Queries, Health, Protocol):
    """What the API and the dashboard use: they read, act on deliveries and
    targets, and /readyz proves the store writable."""


@dataclass
class Operator:
    store: ConsoleStore
    scheduler: Scheduler
    clock: Clock
    metrics: Metrics
    current_config: Callable[[], Config]
    store_stats: Callable[[], tuple[int, int]] = lambda: (0, 0)
    # Whether this instance exports the queue gauges: on a cluster, only the
    # leading instance reads them (see Metrics.set_leading).
    leading: Callable[[], bool] = lambda: True
    _snapshot_at: float = field(default=float("-inf"))

    @property
    def config(self) -> Config:
        return self.current_config()

    @property
    def masker(self) -> Masker:
        return Masker(self.config.secrets)

    async def refresh_metrics(self) -> None:
        commits, writes = self.store_stats()
        self.metrics.commits.set(commits)
        self.metrics.committed_writes.set(writes)
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
        self._snapshot_at = time.monotonic()

    def changed(self) -> None:
        """An operator changed the store: metrics re-read it, the scheduler looks again."""
        self._snapshot_at = float("-inf")
        self.scheduler.targets_changed()

    # What a person may do, from the API or the dashboard alike: each change
    # is followed by `changed()`, so the scheduler acts on it at once.

    async def retry(self, delivery_id: int) -> DeliveryView:
        delivery = await self.store.retry_now(delivery_id, self.clock.now())
        self.changed()
        return delivery

    async def skip(self, delivery_id: int) -> DeliveryView:
        delivery = await self.store.skip(delivery_id, self.clock.now())
        self.changed()
        return delivery

    async def requeue(self, selection: Selection) -> list[int]:
        requeued = await self.store.requeue(selection, self.clock.now())
        self.changed()
        return requeued

    async def resend(self, resend: Resend) -> int:
        """Store a corrected copy as a new event; the scheduler picks it up at once."""
        copy_id = await self.store.resend(resend, self.clock.now())
        self.changed()
        return copy_id

    async def set_paused(self, target: str, paused: bool) -> None:
        if target not in self.config.targets:
            raise NotFound(f"no target {target}")
        await self.store.set_paused(target, paused, self.clock.now())
        self.changed()

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


OPERATOR = web.AppKey("operator", Operator)
