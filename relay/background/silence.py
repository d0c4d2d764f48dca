"""Senders that stop sending: a route that receives nothing for much longer
than it usually does.

WooCommerce disables a webhook after five failed deliveries and never says
so; a Tilda form republished posts to another URL; a T-Bank terminal's
notification URL is changed, a CDEK subscription dropped. Each looks like
silence, and relay is the one place that sees every sender's rhythm.

The rule. A route's silence is the time since its last stored event. It is
**silent** when that silence exceeds its limit for the hour of the week it
is now (in `admin.timezone`):

    limit = max(routes.NAME.silent_after,
                max(alerts.silence_factor × usual, LEARNT_AT_LEAST))

where `usual` is the route's usual longest silence at this hour of the
week: for each of the last LEARN_WEEKS weeks, the longest the route had
been silent at any moment of that hour, and of those the median (the
higher middle one). A shop silent every night from 22:00 to 09:00 has a
usual of eleven hours at 08:00 and of minutes at noon: its nights make no
noise, and a webhook that stops at 21:00 is said silent at the first busy
hour after. Either part may be missing: `usual` until the route has
HISTORY of events learnt and that hour in a past week (no alert before
enough history), `silent_after` unless the route sets it ("never": the
route is not watched); with neither, the route is not judged. A route
that has never received anything is not watched.

Said once, when the limit is passed (an alert, the Overview, the gauge
relay_route_silent), and again when an event arrives ("back"). What is kept
(relay.store.rhythm) survives restarts, and the silence said is not learnt
as usual.

Learnt in the background from the events as stored (events.received_at,
walked by id as the search indexer walks them): the ingest path writes
nothing for it. Judged only once the walk has caught up, so a route is
never said silent for events not yet read. On PostgreSQL the leading
instance learns and judges, for the cluster (relay.background.leadership).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from relay.config import Config
from relay.core.clock import Clock
from relay.core.localtime import Zone, in_zone
from relay.core.units import format_duration
from relay.store import Learned, Rhythms, RouteWatch, StoreError
from relay.targets.alerting import ALERTS_ROUTE

log = logging.getLogger("relay.silence")

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY
# The weeks a route's usual silences are learnt from.
LEARN_WEEKS = 4
# No learnt limit before a route has this much history.
HISTORY = WEEK
# A learnt limit is never shorter: a busy route's minute without a webhook
# is no news.
LEARNT_AT_LEAST = 30 * 60.0
# How often the leader learns and judges; sooner while it has events to catch up on.
EVERY = 60.0
CATCHING_UP = 1.0
# Events read at a time, and how long one pass may read before it gives way
# (a tenth of a core at most while it catches up: after an upgrade, the
# stored events; under a flood, the flood's).
BATCH = 2000
PASS_BUDGET = 0.1
# A Monday: weeks are counted from it (a week runs from Monday 00:00, local).
_MONDAY = datetime(2024, 1, 1).toordinal()


def hour_of_week(timestamp: float, zone: Zone) -> tuple[int, int]:
    """(week, slot): the local week (counted from a Monday) and hour of the
    week (0 = Monday 00:00-01:00, 167 = Sunday 23:00) of a moment."""
    moment = in_zone(timestamp, zone)
    week = (moment.toordinal() - _MONDAY) // 7
    return week, moment.weekday() * 24 + moment.hour


def _hour_start(timestamp: float, zone: Zone) -> float:
    moment = in_zone(timestamp, zone)
    return timestamp - (moment.minute * 60 + moment.second + moment.microsecond / 1e6)


def silences(
    previous: float, at: float, zone: Zone, first_week: int
) -> Iterator[tuple[int, int, float]]:
    """A silence from `previous` to `at`: for each local hour it spans (of
    week `first_week` or later), (week, slot, how long the route had been
    silent at the last moment of it: the hour's end, or `at`)."""
    start = _hour_start(previous, zone)
    while start < at:
        after = _hour_start(start + HOUR + 1, zone)  # the next local hour's start
        week, slot = hour_of_week(start, zone)
        if week >= first_week:
            yield week, slot, min(after, at) - previous
        start = after


def usual(longest: dict[int, float], week: int) -> float | None:
    """The usual longest silence at an hour of the week, from the longest of
    each of the LEARN_WEEKS weeks before `week` (week -> seconds): their
    median, the higher of the middle two."""
    values = sorted(s for w, s in longest.items() if week - LEARN_WEEKS <= w < week)
    return values[len(values) // 2] if values else None


def limit(explicit: float | None, known: float | None, factor: float) -> float | None:
    """The silence past which a route is silent, from its own setting and its
    usual (`known`); None: it is not judged."""
    learnt = max(factor * known, LEARNT_AT_LEAST) if known is not None else None
    limits = [value for value in (explicit, learnt) if value is not None]
    return max(limits) if limits else None


@dataclass
class _Seen:
    first: float
    last: float
    silent: bool


class SilenceWatch:
    """The leader's pass, every EVERY seconds: learn the events stored since
    the last one, then judge every route of the config."""

    def __init__(
        self,
        store: Rhythms,
        config: Config,
        clock: Clock,
        tell: Callable[[list[dict[str, object]]], None],
        *,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        self.config = config
        self._clock = clock
        self._tell = tell  # the alerter's (relay.background.alerts.Alerter.tell)
        self._leading = leading
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    def reconfigure(self, config: Config) -> None:
        self.config = config

    def wake(self) -> None:
        """Pass now: this instance has just taken the lead."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            caught_up = True
            if self._leading():
                try:
                    caught_up = await self.run_once()
                except StoreError as error:
                    log.warning("silence watch: store unavailable, will try again: %s", error)
            every = EVERY if caught_up else CATCHING_UP
            await self._clock.wait(self._wake, self._clock.now() + every)

    async def run_once(self) -> bool:
        """Learn what was stored since, and judge once caught up; True then."""
        caught_up = await self.learn()
        if caught_up:
            await self.judge()
        return caught_up

    async def learn(self) -> bool:
        """Read the events stored since the last pass (within PASS_BUDGET) and
        keep what they say of each route's silences; True when caught up."""
        watches = await self._store.route_watches()
        seen = {
            route: _Seen(w.first_event_at, w.last_event_at, w.silent_since is not None)
            for route, w in watches.routes.items()
        }
        zone = self.config.zone
        now = self._clock.now()
        first_week = hour_of_week(now, zone)[0] - LEARN_WEEKS
        longest: dict[tuple[str, int, int], float] = {}
        changed: set[str] = set()
        back: dict[str, float] = {}  # a silent route -> its first event since
        through = watches.through
        deadline = time.monotonic() + PASS_BUDGET
        caught_up = False
        while not caught_up:
            arrivals = await self._store.arrivals(through, BATCH)
            caught_up = len(arrivals) < BATCH
            for arrival in arrivals:
                route, at = arrival.route, arrival.received_at
                through = arrival.id
                if route == ALERTS_ROUTE:
                    continue
                changed.add(route)
                known = seen.get(route)
                if known is None:
                    seen[route] = _Seen(at, at, False)
                    continue
                if known.silent:
                    # Back: the silence said is no usual one, not learnt.
                    back[route] = at
                    known.silent = False
                elif at > known.last:
                    for week, slot, seconds in silences(known.last, at, zone, first_week):
                        key = (route, week, slot)
                        longest[key] = max(longest.get(key, 0.0), seconds)
                known.first, known.last = min(known.first, at), max(known.last, at)
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0)  # webhooks arriving meanwhile go first
        if through == watches.through:
            return caught_up
        returned = await self._store.learn_rhythm(
            Learned(
                through=through,
                seen={route: (seen[route].first, seen[route].last) for route in changed},
                longest=longest,
                back=tuple(back),
                keep_from_week=first_week,
            )
        )
        for route, was in sorted(returned.items()):
            log.warning(
                "route %s receives again, after %s of silence",
                route,
                format_duration(back[route] - was.last_event_at),
            )
        self._tell([_back_note(route, was, back[route]) for route, was in sorted(returned.items())])
        return caught_up

    async def judge(self) -> None:
        """Say silent every watched route past its limit now (once)."""
        now = self._clock.now()
        config = self.config
        week, slot = hour_of_week(now, config.zone)
        watches = (await self._store.route_watches()).routes
        learnt = await self._store.route_rhythm(slot, range(week - LEARN_WEEKS, week))
        notes = []
        for route in config.routes.values():
            watch = watches.get(route.name)
            if watch is None or watch.silent_since is not None:
                continue
            silence = now - watch.last_event_at
            known = usual(learnt.get(route.name, {}), week)
            if now - watch.first_event_at < HISTORY:
                known = None
            past = limit(route.silent_after, known, config.alerts.silence_factor)
            if past is None or silence <= past:
                continue
            if await self._store.mark_silent(route.name, now, known, past):
                log.warning(
                    "route %s has received nothing for %s: silent (past %s)",
                    route.name,
                    format_duration(silence),
                    format_duration(past),
                )
                notes.append(_silent_note(route.name, silence, known, past))
        self._tell(notes)


def _silent_note(route: str, silence: float, known: float | None, past: float) -> dict[str, object]:
    return {
        "kind": "silent",
        "route": route,
        "silent_seconds": round(silence, 3),
        "usual_seconds": None if known is None else round(known, 3),
        "limit_seconds": round(past, 3),
    }


def _back_note(route: str, was: RouteWatch, at: float) -> dict[str, object]:
    return {"kind": "back", "route": route, "silent_seconds": round(at - was.last_event_at, 3)}
