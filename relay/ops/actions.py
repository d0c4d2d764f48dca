"""`Actions`: what a person may do to deliveries and targets, and its rules, in
one place for every way in — the admin API and the dashboard (through
`relay.admin.console.Console`, which adds the running daemon's side) and the
CLI's database commands.

The rules here are the ones a person meets: which target may be paused, what
a missing event or delivery says; the store decides what may be retried,
skipped or requeued (`Operations`) and says so with NotFound or Conflict.
It imports no web server, template engine or metrics library: a `relay
retry` starts without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from relay.core.clock import Clock
from relay.ops.inputs import known_name, unknown_name
from relay.ops.search import parse_search, refuse_controls
from relay.ops.views import state_said
from relay.store import (
    AuditEntry,
    DeliveryView,
    EventDetail,
    EventQuery,
    NotFound,
    Operations,
    Queries,
    Resend,
    RetriedNow,
    Selection,
    Status,
)
from relay.store.rows import describe_selection

audit_log = logging.getLogger("relay.audit")


def log_action(said: str, by: str, action: str, subject: str, count: int) -> None:
    """The journal's line of a person's action, its fields as the audit's."""
    audit_log.info(
        said, extra={"fields": {"action": action, "by": by, "subject": subject, "count": count}}
    )


# A bulk action shown before it is done (the dashboard's confirmation) names
# the deliveries it will act on; at most this many at once.
BULK_LIMIT = 1000
# Deliveries named that a bulk action left are said one by one, this many at most.
NOT_TAKEN_SAID = 50


def selection_of(query: EventQuery, status: Status = Status.DEAD) -> Selection:
    """The deliveries in `status` a listing of `query` shows: the same filters,
    search included (a bulk action takes what the page shows, no more)."""
    return Selection(
        status=status,
        route=query.route,
        target=query.target,
        since=query.since,
        until=query.until,
        key=query.key,
        search=query.search,
    )


class ActionStore(Operations, Queries, Protocol):
    """What acting needs of the store: its operator verbs, and reading what they act on."""


class KnowsTargets(Protocol):
    """A config as far as acting needs it: the daemon's `Config` or the CLI's
    `DatabaseCommandConfig` (route and target names only)."""

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
        CLI did within its poll interval; the daemon's Console acts at once."""

    async def event(self, event_id: int) -> EventDetail:
        detail = await self.store.get_event(event_id)
        if detail is None:
            # The CLI and the API print delivery ids too (requeue, retry): a
            # person may well try one of them here.
            delivery = await self.store.get_delivery(event_id)
            hint = (
                f"; delivery {event_id} is of event {delivery.event_id}"
                if delivery is not None
                else ""
            )
            raise NotFound(f"no event {event_id}{hint}")
        return detail

    async def delivery(self, delivery_id: int) -> DeliveryView:
        delivery = await self.store.get_delivery(delivery_id)
        if delivery is None:
            raise NotFound(f"no delivery {delivery_id}")
        return delivery

    # Every action names who acts (`by`): the store records it, in the audit
    # and the history of each delivery it touched; one log line says it too.

    async def retry(self, delivery_id: int, *, by: str) -> DeliveryView:
        delivery = await self.store.retry_now(delivery_id, self.clock.now(), by=by)
        self.acted(by, "retry", f"delivery {delivery_id}", 1)
        return delivery

    async def skip(self, delivery_id: int, *, by: str) -> DeliveryView:
        delivery = await self.store.skip(delivery_id, self.clock.now(), by=by)
        self.acted(by, "skip", f"delivery {delivery_id}", 1)
        return delivery

    async def requeue(self, selection: Selection, *, by: str) -> list[int]:
        requeued = await self.store.requeue(selection, self.clock.now(), by=by)
        self.acted(by, "requeue", describe_selection(selection), len(requeued))
        return requeued

    async def retry_selected(self, selection: Selection, *, by: str) -> RetriedNow:
        """One more attempt now for every pending or dead delivery `selection`
        takes (its line's waiting ones left to their turn); Conflict when a
        target they go to is paused."""
        done = await self.store.retry_selected(selection, self.clock.now(), by=by)
        subject = describe_selection(replace(selection, sendable=True))
        self.acted(by, "retry", subject, len(done.ids))
        return done

    async def skip_selected(self, selection: Selection, *, by: str) -> list[int]:
        """Skip every pending or dead delivery `selection` takes."""
        skipped = await self.store.skip_selected(selection, self.clock.now(), by=by)
        self.acted(by, "skip", describe_selection(selection), len(skipped))
        return skipped

    def acted(self, by: str, action: str, subject: str, count: int) -> None:
        """After every action: one log line, then whatever else must follow."""
        log_action("operator action", by, action, subject, count)
        self.changed()

    async def not_taken(
        self, named: Sequence[int], taken: Collection[int], limit: int = NOT_TAKEN_SAID
    ) -> dict[int, str]:
        """The deliveries named (by id or plan) that a bulk action left, each
        with its state in words (state_said: a superseded one names the copy
        that goes instead); the first `limit` of them."""
        done = set(taken)
        said: dict[int, str] = {}
        for delivery_id in [i for i in named if i not in done][:limit]:
            delivery = await self.store.get_delivery(delivery_id)
            said[delivery_id] = "no such delivery" if delivery is None else state_said(delivery)
        return said

    async def select(self, selection: Selection, limit: int = BULK_LIMIT) -> list[int]:
        """What a bulk action on `selection` would act on (a dry run), oldest first."""
        return await self.store.select(selection, limit)

    async def searched(self, query: EventQuery, text: str) -> EventQuery:
        """`query` narrowed by a search box's text, as the dashboard reads it: an
        idempotency key when it names an event these filters show, else the
        text's content (relay.ops.search; SearchError when it cannot be searched).
        Listing and bulk action both narrow through here: the same events."""
        if not text:
            return query
        refuse_controls(text)
        if await self.store.list_events(replace(query, key=text, limit=1)):
            return replace(query, key=text)
        return replace(query, search=parse_search(text))

    async def resend(self, resend: Resend) -> int:
        """Store a corrected copy as a new event (`resend.by` acts); the
        scheduler picks it up."""
        copy_id = await self.store.resend(resend, self.clock.now())
        subject = f"event {resend.original_id} as event {copy_id}"
        self.acted(resend.by, "resend", subject, len(resend.targets))
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

    async def set_paused(self, target: str, paused: bool, *, by: str) -> None:
        """Only a target of the config: a typo would pause nothing, silently."""
        targets = self.current_config().targets
        if target not in targets:
            raise NotFound(unknown_name("target", target, targets))
        await self.store.set_paused(target, paused, self.clock.now(), by=by)
        self.acted(by, "pause" if paused else "resume", f"target {target}", 0)

    async def audit(self, limit: int, before_id: int | None = None) -> list[AuditEntry]:
        return await self.store.list_audit(limit, before_id)
