"""Prometheus metrics (`/metrics`): counters fed by ingress and the scheduler,
gauges read from the store when scraped."""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from relay.config import Config
from relay.core.status import ATTEMPT_OUTCOMES
from relay.kinds.source import REJECT_REASONS
from relay.ops.exposition import (
    Counter,
    Gauge,
    Histogram,
    family,
    histogram_samples,
    render,
    sample,
)
from relay.store import Gauges, RouteWatch, Status, TargetState

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# What became of a webhook, in relay_events_received_total's `result`: every
# one shown at 0 for every route from the start (an unknown path's, not_found,
# under the route ""), so a rule sees the first of each (docs/operate.md lists them).
INGRESS_RESULTS = (
    "queued",
    "duplicate",
    "key_conflict",
    "ping",
    "rejected",
    "too_large",
    "timeout",
    "method_not_allowed",
    "unsupported_encoding",
    "busy",
    "bad_request",
    "unavailable",
)
ALERT_KINDS = ("dead", "keeps_failing", "failing", "recovered", "down", "up", "silent", "back")


@dataclass
class StoreSnapshot:
    gauges: Gauges
    targets: dict[str, TargetState]
    paused: frozenset[str]
    configured: tuple[str, ...]
    now: float
    # Events the search index has not reached yet (SearchProgress.behind).
    index_behind: int = 0
    # Bytes free where the SQLite database lives (None: PostgreSQL's own).
    free_bytes: int | None = None
    # Deliveries that keep failing per (route, target), and the pairs the
    # config has (each exported, at 0 when none).
    failing: Mapping[tuple[str, str], int] = field(default_factory=dict)
    pairs: tuple[tuple[str, str], ...] = ()
    # Each route of the config, as the silence watch keeps it (None: nothing
    # received yet).
    routes: Mapping[str, RouteWatch | None] = field(default_factory=dict)


class Metrics:
    def __init__(self, *, cluster: bool = False) -> None:
        # Counted per request as plain integers, exported when scraped.
        self.ingress = IngressCounters()
        self.key_conflicts = Counter(
            "relay_key_conflicts",
            "Webhooks whose idempotency key was already held by an event with other"
            " content: stored as new events (or refused with 422 where the route says so).",
            ["route"],
        )
        self.rejected = Counter(
            "relay_rejected",
            "Webhooks refused by a route's verification, by reason.",
            ["route", "reason"],
        )
        self.attempts = Counter(
            "relay_attempts",
            "Delivery attempts, by route, target and outcome (success; retry: it will be"
            " tried again; dead: the attempt that ended it, as in the attempt log).",
            ["route", "target", "outcome"],
        )
        self.attempt_seconds = Histogram(
            "relay_attempt_duration_seconds",
            "Duration of delivery attempts, by target.",
            ["target"],
            buckets=ATTEMPT_BUCKETS,
        )
        self.dead = Counter(
            "relay_deliveries_dead",
            "Deliveries that went dead, by route and target.",
            ["route", "target"],
        )
        self.alerts = Counter("relay_alerts", "Alerts created, by kind.", ["kind"])
        self.reloads = Counter("relay_config_reloads", "Config reloads, by result.", ["result"])
        self.reload_failed = Gauge(
            "relay_config_reload_failed",
            "1 while the last config reload was refused (the previous config runs),"
            " 0 once one succeeds.",
        )
        self.purged = Counter("relay_purged_events", "Finished events removed by retention.")
        self.commits = Counter(
            "relay_store_commits",
            "Write transactions committed since start (each one fsync).",
        )
        self.committed_writes = Counter(
            "relay_store_committed_writes",
            "Writes (events, attempts...) in those transactions: the group commit's batching.",
        )
        # Several instances on one database: which one leads (exports the
        # queue gauges, runs retention and alerts). Not shown on one process.
        self._leader = (
            Gauge(
                "relay_cluster_leader",
                "1 on the instance of a PostgreSQL cluster that runs retention and alerts"
                " and exports the queue gauges, 0 on the others.",
            )
            if cluster
            else None
        )
        self._snapshot: StoreSnapshot | None = None

    def configure(self, config: Config) -> None:
        """Every labelled series this config implies, at 0 until it moves: an
        alert rule's `increase(relay_deliveries_dead_total[10m]) > 0` then
        sees the first dead delivery (from an absent series it sees nothing),
        and no rule needs `or vector(0)`. Called at start and on each reload;
        series of what a reload removed stay (a counter never goes back)."""
        self.ingress.received.setdefault(("", "not_found"), 0)
        for route in config.routes.values():
            for result in INGRESS_RESULTS:
                self.ingress.received.setdefault((route.name, result), 0)
            for reason in REJECT_REASONS:
                self.rejected.labels(route.name, reason)
            self.key_conflicts.labels(route.name)
            for route_target in route.targets:
                self.dead.labels(route.name, route_target.target)
                for outcome in ATTEMPT_OUTCOMES:
                    self.attempts.labels(route.name, route_target.target, outcome)
        for target in config.targets:
            self.attempt_seconds.labels(target)
        for kind in ALERT_KINDS:
            self.alerts.labels(kind)
        for result in ("ok", "failed"):
            self.reloads.labels(result)

    def count_attempt(self, route: str, target: str, outcome: str, seconds: float) -> None:
        """One attempt, in relay_attempts_total and its duration's histogram."""
        self.attempts.labels(route, target, outcome).inc()
        self.attempt_seconds.labels(target).observe(seconds)

    def activity(self) -> float:
        """Webhooks received and attempts made since start: grows only while relay works."""
        return sum(self.ingress.received.values()) + self.attempts.total()

    def set_snapshot(self, snapshot: StoreSnapshot | None) -> None:
        """The store's figures to export; None exports none (another instance
        of the cluster exports them)."""
        self._snapshot = snapshot

    def set_leading(self, leading: bool) -> None:
        if self._leader is not None:
            self._leader.set(1 if leading else 0)

    def render(self) -> bytes:
        """The text a Prometheus scrape reads (relay.ops.exposition.CONTENT_TYPE)."""
        lines: list[str] = []
        self.ingress.expose(lines)
        for metric in (
            self.key_conflicts,
            self.rejected,
            self.attempts,
            self.attempt_seconds,
            self.dead,
            self.alerts,
            self.reloads,
            self.reload_failed,
            self.purged,
            self.commits,
            self.committed_writes,
        ):
            metric.expose(lines)
        if self._leader is not None:
            self._leader.expose(lines)
        if self._snapshot is not None:
            _expose_store(lines, self._snapshot)
        return render(lines)


class IngressCounters:
    """What ingress counts on every request, as plain integers read only
    when /metrics is scraped: at thousands of webhooks a second on one core,
    even a label lookup per request is a measurable share of it."""

    def __init__(self) -> None:
        self.received: collections.Counter[tuple[str, str]] = collections.Counter()
        self.ack_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.ack_sum = 0.0

    def count(self, route: str, result: str) -> None:
        self.received[(route, result)] += 1

    def observe_ack(self, seconds: float) -> None:
        self.ack_buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.ack_sum += seconds

    def expose(self, lines: list[str]) -> None:
        name = "relay_events_received_total"
        family(
            lines,
            name,
            "Webhooks received, by route and result: "
            + ", ".join(INGRESS_RESULTS)
            + '; not_found under the route "".',
            "counter",
        )
        for (route, result), count in sorted(self.received.items()):
            sample(lines, name, (("route", route), ("result", result)), count)
        name = "relay_ingest_ack_seconds"
        family(
            lines,
            name,
            "Time from request to answer for stored webhooks (includes the durable commit).",
            "histogram",
        )
        histogram_samples(lines, name, (), LATENCY_BUCKETS, self.ack_buckets, self.ack_sum)


def _expose_store(lines: list[str], snapshot: StoreSnapshot) -> None:
    """Gauges from the last store snapshot; the /metrics handler refreshes it first."""
    name = "relay_deliveries"
    family(
        lines,
        name,
        "Deliveries not yet finished, by target and status (pending, in_flight, dead).",
        "gauge",
    )
    targets = sorted(set(snapshot.configured) | {target for target, _ in snapshot.gauges.counts})
    for target in targets:
        for status in (Status.PENDING, Status.IN_FLIGHT, Status.DEAD):
            count = snapshot.gauges.counts.get((target, status), 0)
            sample(lines, name, (("target", target), ("status", status.value)), count)
    name = "relay_deliveries_held"
    family(
        lines,
        name,
        "Pending deliveries held behind a dead one of their ordering key (order_by),"
        " by target: they wait until a person retries, requeues or skips it.",
        "gauge",
    )
    for target in targets:
        sample(lines, name, (("target", target),), snapshot.gauges.held.get(target, 0))
    name = "relay_deliveries_failing"
    family(
        lines,
        name,
        "Deliveries that keep failing: pending after at least alerts.delivery_failing_after"
        " attempts of their cycle, by route and target.",
        "gauge",
    )
    for route, target in sorted(set(snapshot.pairs) | set(snapshot.failing)):
        labels = (("route", route), ("target", target))
        sample(lines, name, labels, snapshot.failing.get((route, target), 0))
    name = "relay_route_silent"
    family(
        lines,
        name,
        "1 while a route is silent: nothing received for longer than its limit at this"
        " hour of the week (learnt from its own history, or routes.NAME.silent_after).",
        "gauge",
    )
    for route, watch in sorted(snapshot.routes.items()):
        silent = watch is not None and watch.silent_since is not None
        sample(lines, name, (("route", route),), 1.0 if silent else 0.0)
    name = "relay_route_silence_seconds"
    family(
        lines,
        name,
        "Seconds since a route's last event, as the silence watch last learnt it (once a"
        " minute; 0 before its first).",
        "gauge",
    )
    for route, watch in sorted(snapshot.routes.items()):
        silence = max(0.0, snapshot.now - watch.last_event_at) if watch is not None else 0.0
        sample(lines, name, (("route", route),), silence)
    name = "relay_search_index_behind_events"
    family(
        lines,
        name,
        "Stored events the search index has not reached yet (a search does not find them).",
        "gauge",
    )
    sample(lines, name, (), snapshot.index_behind)
    name = "relay_events_flagged"
    family(
        lines,
        name,
        "Stored events a background pass skipped because relay stopped while reading"
        " them (a crash, a kill): shown on the Overview and alerted.",
        "gauge",
    )
    sample(lines, name, (), snapshot.gauges.flagged)
    if snapshot.free_bytes is not None:
        name = "relay_storage_free_bytes"
        family(lines, name, "Bytes free on the file system of the SQLite database.", "gauge")
        sample(lines, name, (), snapshot.free_bytes)
    name = "relay_oldest_pending_seconds"
    family(lines, name, "Age of the oldest event with a pending delivery (0 when none).", "gauge")
    oldest = snapshot.gauges.oldest_pending_received_at
    sample(lines, name, (), max(0.0, snapshot.now - oldest) if oldest is not None else 0.0)
    per_target: tuple[tuple[str, str, Callable[[str, TargetState | None], float]], ...] = (
        (
            "relay_target_paused",
            "1 when the target is paused.",
            lambda target, _: 1.0 if target in snapshot.paused else 0.0,
        ),
        (
            "relay_target_consecutive_failures",
            "Failed attempts in a row, by target.",
            lambda _, state: state.consecutive_failures if state else 0,
        ),
        (
            "relay_target_down",
            "1 when a hold_when_down target is down: its deliveries wait while it is probed.",
            lambda _, state: 1.0 if state is not None and state.down else 0.0,
        ),
        (
            "relay_target_throttled",
            "1 while a receiver's throttle (a 429) holds the target or its episode lasts.",
            lambda _, state: 1.0 if state is not None and state.throttles else 0.0,
        ),
    )
    for name, help_text, reading in per_target:
        family(lines, name, help_text, "gauge")
        for target in snapshot.configured:
            sample(
                lines, name, (("target", target),), reading(target, snapshot.targets.get(target))
            )
