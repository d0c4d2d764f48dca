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

from relay.clock import Clock
from relay.config import AlertsConfig, Config
from relay.outcome import Verdict
from relay.retry import Next
from relay.scheduler import AttemptReport
from relay.store import Intake, NewDelivery, NewEvent, Status, StoreError
from relay.targets import ALERTS_ROUTE
from relay.units import format_duration
from relay.wording import count

log = logging.getLogger("relay.alerts")

__all__ = ["ALERTS_ROUTE", "Alerter", "alert_body"]

# One message lists this many dead deliveries; the count says how many in all.
MAX_LISTED = 50


@dataclass
class _Window:
    dead: list[dict[str, Any]] = field(default_factory=list)
    dead_count: int = 0
    dead_ids: set[int] = field(default_factory=set)
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


class Alerter:
    def __init__(
        self,
        config: AlertsConfig,
        store: Intake,
        clock: Clock,
        *,
        on_created: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self._on_created = on_created
        self._window = _Window()
        self._flush_soon = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping = False

    def reconfigure(self, config: Config) -> None:
        self.config = config.alerts

    def observe(self, report: AttemptReport) -> None:
        """Called for every recorded attempt; cheap, never blocks."""
        target = self.config.target
        delivery = report.delivery
        if target is None or delivery.route == ALERTS_ROUTE:
            return
        window = self._window
        # A manual retry of a dead delivery that fails leaves it dead: it was
        # reported when it went dead. Within a window, each delivery once.
        already_dead = delivery.manual and delivery.resume_status is Status.DEAD
        if (
            report.decision.next is Next.DEAD
            and not already_dead
            and delivery.id not in window.dead_ids
        ):
            window.dead_ids.add(delivery.id)
            window.dead_count += 1
            if len(window.dead) < MAX_LISTED:
                window.dead.append(
                    {
                        "event_id": str(delivery.event_id),
                        "delivery_id": str(delivery.id),
                        "route": delivery.route,
                        "target": delivery.target,
                        "attempts": report.number,
                        "error": report.decision.reason,
                    }
                )
        if delivery.target != target:
            self._down_or_up(report)
            threshold = self.config.failing_after
            streak = report.streak
            if (
                report.outcome.verdict is not Verdict.SUCCESS
                and streak.after == threshold > streak.before
            ):
                window.failing[delivery.target] = {
                    "target": delivery.target,
                    "failures": streak.after,
                    "error": report.outcome.error,
                }
                window.recovered.pop(delivery.target, None)
            elif report.outcome.verdict is Verdict.SUCCESS and streak.before >= threshold:
                window.recovered[delivery.target] = {
                    "target": delivery.target,
                    "failures_before": streak.before,
                }
                window.failing.pop(delivery.target, None)
        if self._window:
            self._flush_soon.set()

    def _down_or_up(self, report: AttemptReport) -> None:
        window = self._window
        name = report.delivery.target
        streak = report.streak
        if streak.went_down:
            window.down[name] = {
                "target": name,
                "failures": streak.after,
                "error": report.outcome.error,
            }
            window.up.pop(name, None)
        elif streak.came_up:
            window.up[name] = {
                "target": name,
                "waited": streak.waited,
                "down_seconds": round(streak.down_for, 3),
            }
            window.down.pop(name, None)

    def problem(self, text: str) -> None:
        """Something wrong with relay itself (its database file went away)."""
        if self.config.target is not None:
            self._window.problems.append(text)
            self._flush_soon.set()

    async def run(self) -> None:
        """Flush at most once per group window, while there is something to say."""
        while not self._stopping:
            await self._flush_soon.wait()
            if self._stopping:
                break
            await self._clock.wait(self._stopped, self._clock.now() + self.config.group_window)
            self._flush_soon.clear()
            await self.flush()

    async def stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        self._flush_soon.set()
        await self.flush()

    async def flush(self) -> int | None:
        """Turn what the window holds into one alert event; returns its id."""
        window, self._window = self._window, _Window()
        if not window or self.config.target is None:
            return None
        body = alert_body(window)
        now = self._clock.now()
        event = NewEvent(
            route=ALERTS_ROUTE,
            idempotency_key=None,
            received_at=now,
            remote_addr=None,
            method="POST",
            path="/_alerts",
            query="",
            headers=[("Content-Type", "application/json")],
            content_type="application/json",
            body=orjson.dumps(body),
        )
        try:
            accepted = await self._store.accept_event(event, [NewDelivery(self.config.target)], now)
        except StoreError as error:
            log.error("alert not stored (%s): %s", error, body["summary"])
            return None
        log.warning("alert %s: %s", accepted.event_id, body["summary"])
        if self._on_created is not None:
            self._on_created(body)
        return accepted.event_id


def alert_body(window: _Window) -> dict[str, Any]:
    parts = []
    lines = []
    if window.dead_count:
        noun = "delivery" if window.dead_count == 1 else "deliveries"
        parts.append(f"{window.dead_count} {noun} went dead")
        for item in window.dead:
            lines.append(
                f"dead: event {item['event_id']} route {item['route']} → {item['target']}"
                f" after {count(item['attempts'], 'attempt')}: {item['error']}"
            )
        if window.dead_count > len(window.dead):
            lines.append(f"... and {window.dead_count - len(window.dead)} more")
        ids = " ".join(item["delivery_id"] for item in window.dead)
        lines.append(f"once the cause is fixed: relay requeue {ids}")
    for item in window.failing.values():
        parts.append(f"target {item['target']} is failing")
        lines.append(
            f"failing: target {item['target']} failed"
            f" {count(item['failures'], 'attempt')} in a row; last error: {item['error']}"
        )
    for item in window.recovered.values():
        parts.append(f"target {item['target']} recovered")
        lines.append(
            f"recovered: target {item['target']} delivered again"
            f" after {count(item['failures_before'], 'failure')}"
        )
    for item in window.down.values():
        parts.append(f"target {item['target']} is down")
        lines.append(
            f"down: target {item['target']} failed {count(item['failures'], 'attempt')} in a row"
            f" (last error: {item['error']}); its deliveries wait, spending no retries,"
            " while relay probes it"
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
