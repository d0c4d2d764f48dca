"""`Actions`: what a person may do to deliveries and targets, and its rules, in
one place for every way in — the admin API and the dashboard (through
`relay.admin.operator.Operator`, which adds the running daemon's side) and the
CLI's operator commands.

The rules here are the ones a person meets: which target may be paused, what
a missing event or delivery says; the store decides what may be retried,
skipped or requeued (`Operations`) and says so with NotFound or Conflict.
It imports no web server, template engine or metrics library: a `relay
retry` starts without them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from relay.clock import Clock
from relay.inputs import known_name, unknown_name
from relay.store import (
    DeliveryView,
    EventDetail,
    NotFound,
    Operations,
    Queries,
    Resend,
    Selection,
)


class ActionStore(Operations, Queries, Protocol):
    """What acting needs of the store: its operator verbs, and reading what they act on."""


class KnowsTargets(Protocol):
    """A config as far as acting needs it: the daemon's `Config` or the CLI's
    `OperatorConfig` (route and target names only)."""

    @property
    def targets(self) -> Collection[str]: ...

    @property
    def routes(self) -> Collection[str]: ...


@dataclass
class Actions:
    store: ActionStore
    clock: Clock
    current_config: Callable[[], KnowsTargets]

    def changed(self) -> None:
        """After every change. Here nothing more: a running daemon sees what the
        CLI did within its poll interval; the daemon's Operator acts at once."""

    async def event(self, event_id: int) -> EventDetail:
        detail = await self.store.get_event(event_id)
        if detail is None:
            raise NotFound(f"no event {event_id}")
        return detail

    async def delivery(self, delivery_id: int) -> DeliveryView:
        delivery = await self.store.get_delivery(delivery_id)
        if delivery is None:
            raise NotFound(f"no delivery {delivery_id}")
        return delivery

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
        """Store a corrected copy as a new event; the scheduler picks it up."""
        copy_id = await self.store.resend(resend, self.clock.now())
        self.changed()
        return copy_id

    async def check_names(self, route: str | None, target: str | None, *, prefix: str = "") -> None:
        """A route or target filter must name one that exists: a typo is an
        error naming the valid ones ("did you mean tilda?"), never a listing of
        "(none)" or "requeued 0". Names the config no longer has but the
        database still holds (a route removed last week) are valid too."""
        config = self.current_config()
        wanted = [
            (name, kind, config_names)
            for name, kind, config_names in (
                (route, "route", config.routes),
                (target, "target", config.targets),
            )
            if name is not None and name not in config_names
        ]
        if not wanted:
            return
        stats = await self.store.stats()
        stored = {"route": stats.counts_by_route, "target": stats.counts_by_target}
        for name, kind, config_names in wanted:
            known_name(name, prefix + kind, kind, {*config_names, *stored[kind]})

    async def set_paused(self, target: str, paused: bool) -> None:
        """Only a target of the config: a typo would pause nothing, silently."""
        targets = self.current_config().targets
        if target not in targets:
            raise NotFound(unknown_name("target", target, targets))
        await self.store.set_paused(target, paused, self.clock.now())
        self.changed()
