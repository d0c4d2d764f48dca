"""Alerts: tell a person when deliveries go dead or a target keeps failing.

Alerts are ordinary events on an internal route, delivered to the target
named in `[alerts] target` with its own retries, so an alert outlives a
restart once created. Within a group window everything that happened makes
one message. Nothing about the alert route or the alert target itself
raises an alert: a broken alert channel cannot feed itself.

A route "failing" at a target and "recovered" are told from its failed
attempts in a row, kept in the store (relay.store.streaks), not in this
process: a person who restarts relay during an outage (a changed relay.env)
is still told when it ends. Attempts are counted into it in runs, soon after
they are made (COUNT_EVERY) and at a stop; on PostgreSQL the streak is the
cluster's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from relay.config import AlertsConfig, Config
from relay.core.clock import Clock
from relay.core.outage_log import OutageLog
from relay.core.outcome import Verdict
from relay.core.payload import Payload
from relay.core.records import Dead, next_status
from relay.core.units import count, format_duration
from relay.delivery.scheduler import AttemptReport
from relay.store import (
    Accepted,
    AlertNote,
    AlertNotes,
    Intake,
    NewDelivery,
    NewEvent,
    Queries,
    RouteRun,
    RouteStreak,
    Status,
    StoreError,
    Streaks,
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
# Attempts are counted into their route's streak (in the store) at most this
# often: what a kill -9 may lose of a streak, and a write a second at most.
COUNT_EVERY = 1.0


class AlertStore(Intake, Streaks, Queries, Protocol):
    """What alerts keep in the store (their own events, and the streaks) and
    read of it (whether a delivery noted as failing still waits)."""


@dataclass
class _Window:
    dead: list[dict[str, Any]] = field(default_factory=list)
    dead_count: int = 0
    dead_ids: set[str] = field(default_factory=set)
    # Deliveries that keep failing (alerts.delivery_failing_after), each once.
    keeps_failing: list[dict[str, Any]] = field(default_factory=list)
    keeps_failing_count: int = 0
    keeps_failing_ids: set[str] = field(default_factory=set)
    failing: dict[str, dict[str, Any]] = field(default_factory=dict)
    recovered: dict[str, dict[str, Any]] = field(default_factory=dict)
    # hold_when_down targets that went down (deliveries held) or came back up.
    down: dict[str, dict[str, Any]] = field(default_factory=dict)
    up: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Routes gone silent (relay.background.silence), or receiving again.
    silent: dict[str, dict[str, Any]] = field(default_factory=dict)
    back: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # relay itself: its database

    def __bool__(self) -> bool:
        return bool(
            self.dead_count
            or self.keeps_failing_count
            or self.failing
            or self.recovered
            or self.down
            or self.up
            or self.silent
            or self.back
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
        elif kind == "keeps_failing":
            if item["delivery_id"] in self.keeps_failing_ids:
                return
            self.keeps_failing_ids.add(item["delivery_id"])
            self.keeps_failing_count += 1
            if len(self.keeps_failing) < MAX_LISTED:
                self.keeps_failing.append(item)
        elif kind == "problem":
            self.problems.append(item["text"])
        else:
            news, opposite = {
                "failing": (self.failing, self.recovered),
                "recovered": (self.recovered, self.failing),
                "down": (self.down, self.up),
                "up": (self.up, self.down),
                "silent": (self.silent, self.back),
                "back": (self.back, self.silent),
            }[kind]
            # Per route and target (failing, recovered), per target (down,
            # up), per route (silent, back).
            if "target" not in item:
                key = item["route"]
            elif "route" in item:
                key = f"{item['route']}→{item['target']}"
            else:
                key = item["target"]
            # The window says where things stand: news undoes its opposite.
            # Bad news that undoes good news not said yet says "again": the
            # good news came after the bad was said, in an earlier alert.
            if opposite.pop(key, None) is not None and kind in ("failing", "down", "silent"):
                item = {**item, "again": True}
            news[key] = item


# An answer quoted in an alert: one line, this long at most.
ANSWER_QUOTED = 300


def quoted(answer: bytes) -> str | None:
    """A target's answer as an alert quotes it (it names the bad field)."""
    text = " ".join(answer.decode("utf-8", errors="replace").split())
    if not text:
        return None
    return text if len(text) <= ANSWER_QUOTED else text[: ANSWER_QUOTED - 1] + "…"


def notes_on(report: AttemptReport, config: AlertsConfig) -> list[Note]:
    """What this attempt gives an alert to say at once (mostly nothing): a
    delivery gone dead, a target down or up. A route failing or recovered is
    told once the attempt is counted into its streak (`streak_notes`)."""
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
    if keeps_failing(report, config):
        notes.append(
            {
                "kind": "keeps_failing",
                "event_id": str(delivery.event_id),
                "delivery_id": str(delivery.id),
                "route": delivery.route,
                "target": delivery.target,
                "attempts": report.cycle_step,
                "cycle": report.cycle_length,
                "error": report.outcome.error,
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
    return notes


def keeps_failing(report: AttemptReport, config: AlertsConfig) -> bool:
    """This attempt is the `delivery_failing_after`-th of its delivery's cycle
    to fail, and the delivery goes on (a later retry, not dead): from now on
    it keeps failing, said once. On a busy target a payload the receiver
    always refuses fails between others' successes, so its route's failures
    in a row (failing_after) never add up; its own attempts do. The count is
    the delivery's own, in the store: a restart neither repeats nor forgets
    it, and a requeue's fresh cycle counts again."""
    return (
        report.cycle_step == config.delivery_failing_after
        and report.outcome.verdict is Verdict.RETRY
        and next_status(report.then) is Status.PENDING
    )


@dataclass
class _Run:
    """Attempts of one route to one target in a row that went the same way,
    not counted yet: `failures` failed (0: they got through), the last one's
    error and answer as an alert quotes it."""

    failures: int
    error: str | None = None
    answer: str | None = None


def streak_notes(
    config: AlertsConfig, route: str, target: str, run: _Run, before: int, after: int
) -> list[Note]:
    """What a run counted into its route's streak (`before` and `after` it)
    gives an alert to say. Failing and recovered are per route and target: a
    CRM that takes every order but refuses every lead (a wrong field mapping)
    is failing for the leads route, and an order delivered meanwhile does not
    say "recovered"."""
    if config.target is None or target == config.target:
        return []
    threshold = config.failing_after
    if run.failures and before < threshold <= after:
        return [
            {
                "kind": "failing",
                "target": target,
                "route": route,
                "failures": threshold,
                "error": run.error,
                "answer": run.answer,
            }
        ]
    if not run.failures and before >= threshold:
        return [{"kind": "recovered", "target": target, "route": route, "failures_before": before}]
    return []


@dataclass
class RouteHealth:
    """Failed attempts in a row per route and target, as last counted by this
    process (the store's: relay.store.streaks), for the dashboard's Overview."""

    streaks: dict[tuple[str, str], int] = field(default_factory=dict)
    # The last error of each failing one.
    errors: dict[tuple[str, str], str] = field(default_factory=dict)

    def load(self, streaks: dict[tuple[str, str], RouteStreak]) -> None:
        for key, streak in streaks.items():
            self.set(key, streak.failures, streak.error)

    def set(self, key: tuple[str, str], failures: int, error: str | None) -> None:
        if failures:
            self.streaks[key] = failures
            self.errors[key] = error or "failed"
        else:
            self.streaks.pop(key, None)
            self.errors.pop(key, None)


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
        store: AlertStore,
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
        # Runs of attempts not counted into their streaks yet, by (route,
        # target), in order; and a batch whose counting failed, as it was.
        self._runs: dict[tuple[str, str], list[_Run]] = {}
        self._uncounted: list[tuple[tuple[str, str], _Run]] | None = None
        self._counting = asyncio.Lock()  # one batch counted at a time, as notes are stored
        self._not_counted = OutageLog()
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

    async def load(self) -> None:
        """Read the streaks as the store keeps them (at start, for the Overview)."""
        self.health.load(await self._store.route_streaks())

    def observe(self, report: AttemptReport) -> None:
        """Called for every recorded attempt; cheap, never blocks."""
        delivery = report.delivery
        if delivery.route != ALERTS_ROUTE and report.outcome.target_at_fault:
            failed = report.outcome.verdict is not Verdict.SUCCESS
            self._add_run(delivery.route, delivery.target, failed, report)
        self._note(notes_on(report, self.config))

    def _add_run(self, route: str, target: str, failed: bool, report: AttemptReport) -> None:
        if not self._runs and self._uncounted is None:
            self._flush_soon.set()  # the first to count: the loop counts it soon
        runs = self._runs.setdefault((route, target), [])
        last = runs[-1] if runs else None
        if failed:
            if last is None or not last.failures:
                last = _Run(0)
                runs.append(last)
            last.failures += 1
            last.error = report.outcome.error
            last.answer = quoted(report.answer)
        elif last is None or last.failures:
            runs.append(_Run(0))

    async def count(self) -> None:
        """Count the runs of attempts seen so far into their streaks (in the
        store), and note what made a route failing or recovered. A batch the
        store did not take is counted again as it was, before the next."""
        notes: list[Note] = []
        async with self._counting:
            while True:
                if self._uncounted is None:
                    if not self._runs:
                        break
                    self._uncounted = [
                        (key, run) for key, runs in self._runs.items() for run in runs
                    ]
                    self._runs = {}
                batch = self._uncounted
                streaks = await self._store.count_runs(
                    [RouteRun(*key, run.failures, run.error) for key, run in batch],
                    self._clock.now(),
                )
                self._uncounted = None
                for ((route, target), run), (before, after) in zip(batch, streaks, strict=True):
                    self.health.set((route, target), after, run.error)
                    notes += streak_notes(self.config, route, target, run, before, after)
        self._note(notes)

    async def _count_quietly(self) -> None:
        """`count`, its failures said as an outage (relay.core.outage_log)."""
        now = self._clock.now()
        try:
            await self.count()
        except StoreError as error:
            if self._not_counted.failed(now):
                log.warning("attempts not counted into their routes' streaks yet: %s", error)
            return
        lasted = self._not_counted.ended(now) if self._not_counted.failures else None
        if lasted is not None:
            log.info("attempts counted into their routes' streaks again")

    @property
    def _to_count(self) -> bool:
        return bool(self._runs) or self._uncounted is not None

    def problem(self, text: str) -> None:
        """Something wrong with relay itself (its database file went away)."""
        if self.config.target is not None:
            self._note([{"kind": "problem", "text": text}])

    def tell(self, notes: list[Note]) -> None:
        """What another watcher saw (a route gone silent, and back), to say
        with the rest of the window; nothing while alerts are off."""
        if self.config.target is not None:
            self._note(notes)

    def wake(self) -> None:
        """Look at the shared notes now: this instance has just taken the lead."""
        self._flush_soon.set()

    def _note(self, notes: list[Note]) -> None:
        if not notes:
            return
        if self._shared is not None:
            self._outbox.extend(notes)
        else:
            for note in notes:
                self._window.add(note)
        if self._outbox or self._window:
            self._flush_soon.set()

    async def run(self) -> None:
        """Count attempts at most every COUNT_EVERY while there are some, and
        flush at most once per group window, while there is something to say."""
        if self._shared is not None:
            await self._run_shared(self._shared)
            return
        counted_at = float("-inf")
        window_ends: float | None = None
        while not self._stopping:
            now = self._clock.now()
            if self._to_count and now >= counted_at + COUNT_EVERY:
                counted_at = now
                await self._count_quietly()
            if self._window and window_ends is None:
                window_ends = now + self.config.group_window
            if window_ends is not None and now >= window_ends:
                window_ends = None
                await self._flush_window()
                continue
            dues = [window_ends] if window_ends is not None else []
            if self._to_count:
                dues.append(counted_at + COUNT_EVERY)
            if self._stopping:  # asked while this counted or flushed: its wake-up is spent
                break
            self._flush_soon.clear()
            if not dues:
                await self._flush_soon.wait()
            elif self._to_count:  # runs that come meanwhile wait for their turn
                await self._clock.wait(self._stopped, min(dues))
            else:  # the first run to count comes sooner than the window's end
                await self._clock.wait(self._flush_soon, min(dues))

    async def _run_shared(self, shared: AlertNotes) -> None:
        """Count this instance's attempts and store its notes; when leading,
        send every instance's notes one group window after the oldest of them
        was noted."""
        while not self._stopping:
            until = self._clock.now() + max(NOTES_POLL, COUNT_EVERY)
            try:
                await self.count()
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
        """Count the attempts seen so far, then turn what the window holds into
        one alert event now; returns its id.

        Shared: this instance's notes are stored, and, when it leads, every
        instance's notes are sent."""
        if self._shared is not None:
            try:
                await self.count()
                await self._store_notes(self._shared)
                if not self._leading():
                    return None
                return await self._send(self._shared, await self._shared.alert_notes())
            except StoreError as error:
                log.error("alert notes not stored or sent (%s): they wait in the store", error)
                return None
        await self._count_quietly()
        return await self._flush_window()

    async def _flush_window(self) -> int | None:
        window, self._window = self._window, _Window()
        if not window or self.config.target is None:
            return None
        await self._settled(window)
        if not window:
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
        await self._settled(window)
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

    async def _settled(self, window: _Window) -> None:
        """Leave out of `window` the deliveries noted as failing that are no
        longer waiting (delivered, skipped, resent or dead since, within the
        window): an alert says what to do now, not what was true a minute ago."""
        waiting = []
        for item in window.keeps_failing:
            delivery = await self._store.get_delivery(int(item["delivery_id"]))
            if delivery is not None and delivery.status in (Status.PENDING, Status.IN_FLIGHT):
                waiting.append(item)
        window.keeps_failing_count -= len(window.keeps_failing) - len(waiting)
        window.keeps_failing = waiting

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


def _again(item: dict[str, Any]) -> str:
    """ " again" (with why) when the good news in between went unsaid."""
    return " again (it was back in between)" if item.get("again") else ""


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
    if window.keeps_failing_count:
        many = window.keeps_failing_count
        parts.append(f"{many} {'delivery keeps' if many == 1 else 'deliveries keep'} failing")
        for item in window.keeps_failing:
            lines.append(
                f"keeps failing: delivery {item['delivery_id']} of event {item['event_id']}"
                f" (route {item['route']} → {item['target']}) failed"
                f" {item['attempts']} attempts of its cycle of {item['cycle']}; last error:"
                f" {item['error']}{_said(item)}"
            )
        if many > len(window.keeps_failing):
            lines.append(f"... and {many - len(window.keeps_failing)} more")
        events = list(dict.fromkeys(i["event_id"] for i in window.keeps_failing))
        ids = " ".join(i["delivery_id"] for i in window.keeps_failing)
        shown = f"relay show {events[0]}" + (" (and each event above)" if len(events) > 1 else "")
        lines.append(
            f"each is retried on its schedule, and dead when its cycle ends: {shown} says"
            f" why; correct it and send it again (relay resend {events[0]} --edit), or skip"
            f" it (relay skip {ids})"
        )
    for item in window.failing.values():
        parts.append(f"{_where(item)} is failing{_again(item)}")
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
        parts.append(f"target {item['target']} is down{_again(item)}")
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
            f" {count(item['waited'], 'waiting delivery', 'waiting deliveries')} now"
            f" {'flows' if item['waited'] == 1 else 'flow'}, oldest first"
        )
    for item in window.silent.values():
        parts.append(f"route {item['route']} is silent{_again(item)}")
        usual, past = item.get("usual_seconds"), format_duration(item["limit_seconds"])
        why = (
            f"at this hour of the week it is usually silent {format_duration(usual)} at most;"
            f" said past {past}"
            if usual is not None
            else f"past its silent_after, {past}"
        )
        lines.append(
            f"silent: route {item['route']} has received nothing for"
            f" {format_duration(item['silent_seconds'])} ({why}). A sender that stops sending looks"
            " like this: WooCommerce disables a webhook after 5 failed deliveries, a"
            " republished Tilda form may post to another URL; check the sender's webhook"
            " settings and its log"
        )
    for item in window.back.values():
        parts.append(f"route {item['route']} receives again")
        lines.append(
            f"back: route {item['route']} received an event again after"
            f" {format_duration(item['silent_seconds'])} of silence"
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
        "keeps_failing_count": window.keeps_failing_count,
        "keeps_failing": window.keeps_failing,
        "failing": list(window.failing.values()),
        "recovered": list(window.recovered.values()),
        "down": list(window.down.values()),
        "up": list(window.up.values()),
        "silent": list(window.silent.values()),
        "back": list(window.back.values()),
        "problems": window.problems,
    }
