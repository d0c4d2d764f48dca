"""Alerts: tell a person when deliveries go dead or a target keeps failing.

Alerts are ordinary events on an internal route, delivered to the target
named in `[alerts] target` with its own retries, so an alert outlives a
restart once created. Within a group window everything that happened makes
one message. Nothing about the alert route or the alert target itself
raises an alert: a broken alert channel cannot feed itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from relay.config import AlertsConfig, Config
from relay.core.clock import Clock
from relay.core.outcome import Verdict
from relay.core.payload import Payload
from relay.core.records import Dead
from relay.core.units import count, format_duration
from relay.delivery.scheduler import AttemptReport
from relay.store import (
    Accepted,
    AlertNote,
    AlertNotes,
    Intake,
    NewDelivery,
    NewEvent,
    Status,
    StoreError,
)
from relay.targets.alerting import ALERTS_ROUTE

log = logging.getLogger("relay.alerts")

__all__ = ["ALERTS_ROUTE", "Alerter", "alert_body"]

# One message lists this many dead deliveries; the count says how many in all.
MAX_LISTED = 50


# What an attempt saw that an alert must say, as a plain JSON-able value:
# {"kind": "dead" | "failing" | "recovered" | "down" | "up" | "problem", ...}.
# On one process the notes go straight into the window; on a cluster every
# instance stores them and the leading one reads them back into one window.
Note = dict[str, Any]

# How often the leading instance of a cluster looks for other instances' notes.
NOTES_POLL = 1.0


@dataclass
class _Window:
    dead: list[dict[str, Any]] = field(default_factory=list)
    dead_count: int = 0
    dead_ids: set[str] = field(default_factory=set)
    failing: dict[str, dict[str, Any]] = field(default_factory=dict)
    recovered: dict[str, dict[str, Any]] = field(default_factory=dict)
    # hold_when_down targets that went down (deliveries held) or came back up.
    down: dict[str, dict[str, Any]] = field(default_factory=dict)
    up: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # relay itself: its database

    def __bool__(self) -> bool:
        return bool(
            self.dead_count
            or self.failing
            or self.recovered
            or self.down
            or self.up
            or self.problems
        )

    def add(self, note: Note) -> None:
        """Fold one note in; later news about a target replaces earlier news."""
        item = {key: value for key, value in note.items() if key != "kind"}
        kind = note["kind"]
        if kind == "dead":
            # Within a window, each delivery once.
            if item["delivery_id"] in self.dead_ids:
                return
            self.dead_ids.add(item["delivery_id"])
            self.dead_count += 1
            if len(self.dead) < MAX_LISTED:
                self.dead.append(item)
        elif kind == "problem":
            self.problems.append(item["text"])
        else:
            news, opposite = {
                "failing": (self.failing, self.recovered),
                "recovered": (self.recovered, self.failing),
                "down": (self.down, self.up),
                "up": (self.up, self.down),
            }[kind]
            # Per route and target when the note names a route (failing,
            # recovered), else per target (down, up).
            key = f"{item['route']}→{item['target']}" if "route" in item else item["target"]
            news[key] = item
            opposite.pop(key, None)


# An answer quoted in an alert: one line, this long at most.
ANSWER_QUOTED = 300


def quoted(answer: bytes) -> str | None:
    """A target's answer as an alert quotes it (it names the bad field)."""
    text = " ".join(answer.decode("utf-8", errors="replace").split())
    if not text:
        return None
    return text if len(text) <= ANSWER_QUOTED else text[: ANSWER_QUOTED - 1] + "…"


def notes_on(
    report: AttemptReport, config: AlertsConfig, route_streak: tuple[int, int] | None = None
) -> list[Note]:
    """What this attempt gives an alert to say (mostly nothing). `route_streak`:
    its route and target's failures in a row before and after it (RouteHealth)."""
    delivery = report.delivery
    if config.target is None or delivery.route == ALERTS_ROUTE:
        return []
    notes: list[Note] = []
    answer = quoted(report.answer)
    # A manual retry of a dead delivery that fails leaves it dead: it was
    # reported when it went dead.
    already_dead = delivery.manual and delivery.resume_status is Status.DEAD
    if isinstance(report.then, Dead) and not already_dead:
        notes.append(
            {
                "kind": "dead",
                "event_id": str(delivery.event_id),
                "delivery_id": str(delivery.id),
                "route": delivery.route,
                "target": delivery.target,
                "attempts": report.number,
                "error": report.then.reason,
                # Refused for its payload (a 4xx, a broken template): a
                # requeue sends the same bytes, only an edited copy can pass.
                "refused": report.outcome.verdict is Verdict.FAIL,
                "answer": answer,
            }
        )
    if delivery.target == config.target:
        return notes
    name = delivery.target
    streak = report.streak
    error = report.outcome.error
    if streak.went_down:
        notes.append(
            {
                "kind": "down",
                "target": name,
                "failures": streak.after,
                "error": error,
                "answer": answer,
            }
        )
    elif streak.came_up:
        notes.append(
            {
                "kind": "up",
                "target": name,
                "waited": streak.waited,
                "down_seconds": round(streak.down_for, 3),
            }
        )
    if route_streak is None:
        return notes
    # Failing and recovered are per route and target: a CRM that takes every
    # order but refuses every lead (a wrong field mapping) is failing for the
    # leads route, and an order delivered meanwhile does not say "recovered".
    threshold = config.failing_after
    before, after = route_streak
    if report.outcome.verdict is not Verdict.SUCCESS and after == threshold > before:
        notes.append(
            {
                "kind": "failing",
                "target": name,
                "route": delivery.route,
                "failures": after,
                "error": error,
                "answer": answer,
            }
        )
    elif report.outcome.verdict is Verdict.SUCCESS and before >= threshold:
        notes.append(
            {
                "kind": "recovered",
                "target": name,
                "route": delivery.route,
                "failures_before": before,
            }
        )
    return notes


@dataclass
class RouteHealth:
    """Failed attempts in a row per route and target, as this process saw them
    (a cluster's instances each count their own; a restart starts at 0)."""

    streaks: dict[tuple[str, str], int] = field(default_factory=dict)
    # The last error of each failing one, for the dashboard's Overview.
    errors: dict[tuple[str, str], str] = field(default_factory=dict)

    def record(
        self, route: str, target: str, verdict: Verdict, error: str | None = None
    ) -> tuple[int, int]:
        """Count one attempt; returns the streak before and after it."""
        key = (route, target)
        before = self.streaks.get(key, 0)
        after = 0 if verdict is Verdict.SUCCESS else before + 1
        if after:
            self.streaks[key] = after
            self.errors[key] = error or "failed"
        else:
            self.streaks.pop(key, None)
            self.errors.pop(key, None)
        return before, after


class Alerter:
    """Groups what attempts saw into one alert per window.

    With `shared` (several instances on one database) every instance stores
    its notes there and only the instance `leading()` names groups them: a
    window's deliveries gone dead on three instances make one alert, not
    three, and notes taken but not yet sent by a leader that died are sent by
    the next one.
    """

    def __init__(
        self,
        config: AlertsConfig,
        store: Intake,
        clock: Clock,
        *,
        on_created: Callable[[dict[str, Any]], None] | None = None,
        shared: AlertNotes | None = None,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self._on_created = on_created
        self._shared = shared
        self._leading = leading
        self._window = _Window()
        self.health = RouteHealth()
        self._outbox: list[Note] = []  # shared: noted here, not stored yet
        self._unstored: list[bytes] | None = None  # shared: a batch whose storing failed
        # One batch stored at a time: stop()'s flush while the task stores one
        # would otherwise store that very batch again (_unstored is set until
        # its write answers).
        self._storing = asyncio.Lock()
        self._flush_soon = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping = False

    def reconfigure(self, config: Config) -> None:
        self.config = config.alerts

    def observe(self, report: AttemptReport) -> None:
        """Called for every recorded attempt; cheap, never blocks."""
        delivery = report.delivery
        route_streak = None
        if delivery.route != ALERTS_ROUTE and report.outcome.target_at_fault:
            route_streak = self.health.record(
                delivery.route, delivery.target, report.outcome.verdict, report.outcome.error
            )
        self._note(notes_on(report, self.config, route_streak))

    def problem(self, text: str) -> None:
        """Something wrong with relay itself (its database file went away)."""
        if self.config.target is not None:
            self._note([{"kind": "problem", "text": text}])

    def wake(self) -> None:
        """Look at the shared notes now: this instance has just taken the lead."""
        self._flush_soon.set()

    def _note(self, notes: list[Note]) -> None:
        if self._shared is not None:
            self._outbox.extend(notes)
        else:
            for note in notes:
                self._window.add(note)
        if self._outbox or self._window:
            self._flush_soon.set()

    async def run(self) -> None:
        """Flush at most once per group window, while there is something to say."""
        if self._shared is not None:
            await self._run_shared(self._shared)
            return
        while not self._stopping:
            await self._flush_soon.wait()
            if self._stopping:
                break
            await self._clock.wait(self._stopped, self._clock.now() + self.config.group_window)
            self._flush_soon.clear()
            await self.flush()

    async def _run_shared(self, shared: AlertNotes) -> None:
        """Store this instance's notes; when leading, send every instance's
        notes one group window after the oldest of them was noted."""
        while not self._stopping:
            until = self._clock.now() + NOTES_POLL
            try:
                await self._store_notes(shared)
                if self._leading():
                    notes = await shared.alert_notes()
                    if notes:
                        due = notes[0].noted_at + self.config.group_window
                        if self._clock.now() >= due:
                            await self._send(shared, notes)
                            continue
                        until = min(until, due)
            except StoreError as error:
                log.warning("alert notes not read or stored, will try again: %s", error)
            await self._clock.wait(self._flush_soon, until)
            self._flush_soon.clear()

    async def _store_notes(self, shared: AlertNotes) -> None:
        async with self._storing:
            while True:
                if self._unstored is None:
                    if not self._outbox:
                        return
                    self._unstored = [orjson.dumps(note) for note in self._outbox]
                    self._outbox = []
                # A batch that failed is stored again as it was, alone: the store
                # knows it again (one whose answer was lost is not noted twice).
                await shared.note_alerts(self._unstored, self._clock.now())
                self._unstored = None

    async def stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        self._flush_soon.set()
        await self.flush()

    async def flush(self) -> int | None:
        """Turn what the window holds into one alert event now; returns its id.

        Shared: this instance's notes are stored, and, when it leads, every
        instance's notes are sent."""
        if self._shared is not None:
            try:
                await self._store_notes(self._shared)
                if not self._leading():
                    return None
                return await self._send(self._shared, await self._shared.alert_notes())
            except StoreError as error:
                log.error("alert notes not stored or sent (%s): they wait in the store", error)
                return None
        window, self._window = self._window, _Window()
        if not window or self.config.target is None:
            return None
        body = alert_body(window)
        try:
            # An alert is stored even into a database file that was deleted
            # (the open file still delivers): it is what says so.
            accepted = await self._store.accept_event(
                self._event(body),
                [NewDelivery(self.config.target)],
                self._clock.now(),
                from_sender=False,
            )
        except StoreError as error:
            log.error("alert not stored (%s): %s", error, body["summary"])
            return None
        return self._created(accepted, body)

    async def _send(self, shared: AlertNotes, notes: list[AlertNote]) -> int | None:
        """One alert saying every note, stored as the notes are taken away."""
        window = _Window()
        for note in notes:
            window.add(orjson.loads(note.note))
        target = self.config.target
        ids = [note.id for note in notes]
        if not window or target is None:
            # Alerts were turned off meanwhile: what was noted goes unsaid.
            await shared.send_alert(ids, None, [], self._clock.now())
            return None
        body = alert_body(window)
        accepted = await shared.send_alert(
            ids, self._event(body), [NewDelivery(target)], self._clock.now()
        )
        if accepted is None:
            return None
        return self._created(accepted, body)

    def _event(self, body: dict[str, Any]) -> NewEvent:
        return NewEvent(
            route=ALERTS_ROUTE,
            idempotency_key=None,
            received_at=self._clock.now(),
            remote_addr=None,
            payload=Payload(
                method="POST",
                path="/_alerts",
                query="",
                headers=[("Content-Type", "application/json")],
                content_type="application/json",
                body=orjson.dumps(body),
            ),
        )

    def _created(self, accepted: Accepted, body: dict[str, Any]) -> int:
        log.warning("alert %s: %s", accepted.event_id, body["summary"])
        if self._on_created is not None:
            self._on_created(body)
        return accepted.event_id


def _said(item: dict[str, Any]) -> str:
    """The target's answer, quoted, when the note has one."""
    answer = item.get("answer")
    return f"; it answered: {answer}" if answer else ""


def _where(item: dict[str, Any]) -> str:
    """ "target crm for route leads" (a route-target's news) or "target crm"."""
    route = item.get("route")
    return f"target {item['target']} for route {route}" if route else f"target {item['target']}"


def alert_body(window: _Window) -> dict[str, Any]:
    parts = []
    lines = []
    if window.dead_count:
        noun = "delivery" if window.dead_count == 1 else "deliveries"
        parts.append(f"{window.dead_count} {noun} went dead")
        for item in window.dead:
            lines.append(
                f"dead: event {item['event_id']} route {item['route']} → {item['target']}"
                f" after {count(item['attempts'], 'attempt')}: {item['error']}{_said(item)}"
            )
        if window.dead_count > len(window.dead):
            lines.append(f"... and {window.dead_count - len(window.dead)} more")
        retried = " ".join(i["delivery_id"] for i in window.dead if not i.get("refused"))
        refused = [i["event_id"] for i in window.dead if i.get("refused")]
        if retried:
            lines.append(f"once the target works again: relay requeue {retried}")
        for event_id in dict.fromkeys(refused):
            lines.append(
                f"event {event_id} was refused for what it says: correct it and send it"
                f" again (relay resend {event_id} --edit, or the event page's Edit and resend)"
            )
    for item in window.failing.values():
        parts.append(f"{_where(item)} is failing")
        lines.append(
            f"failing: {_where(item)} failed"
            f" {count(item['failures'], 'attempt')} in a row; last error: {item['error']}"
            f"{_said(item)}"
        )
    for item in window.recovered.values():
        parts.append(f"{_where(item)} recovered")
        lines.append(
            f"recovered: {_where(item)} delivered again"
            f" after {count(item['failures_before'], 'failure')}"
        )
    for item in window.down.values():
        parts.append(f"target {item['target']} is down")
        lines.append(
            f"down: target {item['target']} failed {count(item['failures'], 'attempt')} in a row"
            f" (last error: {item['error']}{_said(item)}); its deliveries wait, spending no"
            " retries, while relay probes it"
        )
    for item in window.up.values():
        parts.append(f"target {item['target']} is up")
        lines.append(
            f"up: target {item['target']} answered again after"
            f" {format_duration(item['down_seconds'])} down;"
            f" {item['waited']} waiting deliveries now flow, oldest first"
        )
    for problem in window.problems:
        parts.append(problem.split(":", 1)[0])
        lines.append(f"problem: {problem}")
    summary = "relay: " + "; ".join(parts)
    return {
        "type": "relay.alert",
        "summary": summary,
        "text": "\n".join([summary, *lines]),
        "dead_count": window.dead_count,
        "dead": window.dead,
        "failing": list(window.failing.values()),
        "recovered": list(window.recovered.values()),
        "down": list(window.down.values()),
        "up": list(window.up.values()),
        "problems": window.problems,
    }
