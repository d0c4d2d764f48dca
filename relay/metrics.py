"""Prometheus metrics (`/metrics`): counters fed by ingress and the scheduler,
gauges read from the store when scraped."""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from relay.store import Gauges, Status, TargetState

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class StoreSnapshot:
    gauges: Gauges
    targets: dict[str, TargetState]
    paused: frozenset[str]
    configured: tuple[str, ...]
    now: float


class Metrics:
    def __init__(self, *, cluster: bool = False) -> None:
        # A registry of our own: several relays in one test process must not mix.
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        # Counted per request as plain integers, exported when scraped.
        self.ingress = IngressCounters()
        registry.register(_IngressCollector(self.ingress))
        self.key_conflicts = Counter(
            "relay_key_conflicts",
            "Webhooks whose idempotency key was already held by an event with other"
            " content: stored as new events (or refused with 422 where the route says so).",
            ["route"],
            registry=registry,
        )
        self.rejected = Counter(
            "relay_rejected",
            "Webhooks refused by a route's verification, by reason.",
            ["route", "reason"],
            registry=registry,
        )
        self.attempts = Counter(
            "relay_attempts",
            "Delivery attempts, by target and outcome (success, retry, fail).",
            ["target", "outcome"],
            registry=registry,
        )
        self.attempt_seconds = Histogram(
            "relay_attempt_duration_seconds",
            "Duration of delivery attempts, by target.",
            ["target"],
            buckets=ATTEMPT_BUCKETS,
            registry=registry,
        )
        self.dead = Counter(
            "relay_deliveries_dead",
            "Deliveries that went dead, by route and target.",
            ["route", "target"],
            registry=registry,
        )
        self.alerts = Counter(
            "relay_alerts", "Alerts created, by kind.", ["kind"], registry=registry
        )
        self.reloads = Counter(
            "relay_config_reloads", "Config reloads, by result.", ["result"], registry=registry
        )
        self.purged = Counter(
            "relay_purged_events", "Finished events removed by retention.", registry=registry
        )
        self.commits = Gauge(
            "relay_store_commits",
            "Write transactions committed since start (each one fsync).",
            registry=registry,
        )
        self.committed_writes = Gauge(
            "relay_store_committed_writes",
            "Writes (events, attempts...) in those transactions: the group commit's batching.",
            registry=registry,
        )
        # Several instances on one database: which one leads (exports the
        # queue gauges, runs retention and alerts). Not shown on one process.
        self._leader = (
            Gauge(
                "relay_cluster_leader",
                "1 on the instance of a PostgreSQL cluster that runs retention and alerts"
                " and exports the queue gauges, 0 on the others.",
                registry=registry,
            )
            if cluster
            else None
        )
        self._snapshot: StoreSnapshot | None = None
        registry.register(_StoreCollector(lambda: self._snapshot))
        self._attempt_counters: dict[tuple[str, str], Counter] = {}
        self._attempt_histograms: dict[str, Histogram] = {}

    def count_attempt(self, target: str, outcome: str, seconds: float) -> None:
        """One attempt, in relay_attempts_total and its duration's histogram."""
        counter = self._attempt_counters.get((target, outcome))
        if counter is None:  # labels() takes a lock and a lookup: once per pair
            counter = self._attempt_counters[(target, outcome)] = self.attempts.labels(
                target, outcome
            )
        counter.inc()
        histogram = self._attempt_histograms.get(target)
        if histogram is None:
            histogram = self._attempt_histograms[target] = self.attempt_seconds.labels(target)
        histogram.observe(seconds)

    def set_snapshot(self, snapshot: StoreSnapshot | None) -> None:
        """The store's figures to export; None exports none (another instance
        of the cluster exports them)."""
        self._snapshot = snapshot

    def set_leading(self, leading: bool) -> None:
        if self._leader is not None:
            self._leader.set(1 if leading else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class IngressCounters:
    """What ingress counts on every request, as plain integers.

    prometheus-client's own metrics take a lock on each increment; at
    thousands of webhooks a second on one core that is a measurable share of
    the request. These are only read when /metrics is scraped.
    """

    def __init__(self) -> None:
        self.received: collections.Counter[tuple[str, str]] = collections.Counter()
        self.ack_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.ack_sum = 0.0

    def count(self, route: str, result: str) -> None:
        self.received[(route, result)] += 1

    def observe_ack(self, seconds: float) -> None:
        self.ack_buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.ack_sum += seconds


class _IngressCollector(Collector):
    def __init__(self, counters: IngressCounters) -> None:
        self._counters = counters

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        counters = self._counters
        received = CounterMetricFamily(
            "relay_events_received",
            "Webhooks received, by route and result (queued, duplicate, ping, rejected,"
            " too_large, timeout, not_found, method_not_allowed, unsupported_encoding, busy,"
            " bad_request, key_conflict, unavailable).",
            labels=["route", "result"],
        )
        for (route, result), count in sorted(counters.received.items()):
            received.add_metric([route, result], count)
        yield received
        cumulative = list(itertools.accumulate(counters.ack_buckets))
        bounds = [str(bound) for bound in LATENCY_BUCKETS] + ["+Inf"]
        yield HistogramMetricFamily(
            "relay_ingest_ack_seconds",
            "Time from request to answer for stored webhooks (includes the durable commit).",
            buckets=list(zip(bounds, cumulative, strict=True)),
            sum_value=counters.ack_sum,
        )


class _StoreCollector(Collector):
    """Gauges from the last store snapshot; the /metrics handler refreshes it first."""

    def __init__(self, snapshot: Callable[[], StoreSnapshot | None]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        if snapshot is None:
            return
        deliveries = GaugeMetricFamily(
            "relay_deliveries",
            "Deliveries not yet finished, by target and status (pending, in_flight, dead).",
            labels=["target", "status"],
        )
        targets = sorted(
            set(snapshot.configured) | {target for target, _ in snapshot.gauges.counts}
        )
        for target in targets:
            for status in (Status.PENDING, Status.IN_FLIGHT, Status.DEAD):
                count = snapshot.gauges.counts.get((target, status), 0)
                deliveries.add_metric([target, status.value], count)
        yield deliveries
        oldest = snapshot.gauges.oldest_pending_received_at
        yield GaugeMetricFamily(
            "relay_oldest_pending_seconds",
            "Age of the oldest event with a pending delivery (0 when none).",
            value=max(0.0, snapshot.now - oldest) if oldest is not None else 0.0,
        )
        paused = GaugeMetricFamily(
            "relay_target_paused", "1 when the target is paused.", labels=["target"]
        )
        failures = GaugeMetricFamily(
            "relay_target_consecutive_failures",
            "Failed attempts in a row, by target.",
            labels=["target"],
        )
        down = GaugeMetricFamily(
            "relay_target_down",
            "1 when a hold_when_down target is down: its deliveries wait while it is probed.",
            labels=["target"],
        )
        for target in snapshot.configured:
            paused.add_metric([target], 1.0 if target in snapshot.paused else 0.0)
            state = snapshot.targets.get(target)
            failures.add_metric([target], state.consecutive_failures if state else 0)
            down.add_metric([target], 1.0 if state is not None and state.down else 0.0)
        yield paused
        yield failures
        yield down
