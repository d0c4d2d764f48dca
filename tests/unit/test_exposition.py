"""relay writes Prometheus's text format itself (relay.ops.exposition); what it
writes is read back here by Prometheus's own Python client, the parser its
maintainers keep in step with the format, and its numbers compared with
that client's formatting."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from relay.ops.exposition import number
from relay.ops.metrics import LATENCY_BUCKETS, Metrics, StoreSnapshot
from relay.store import Gauges, Status, TargetState

AWKWARD = 'quote " backslash \\ newline \n кириллица'


def parsed(metrics: Metrics) -> dict[str, tuple[str, str, list[Sample]]]:
    """Each family by name: (type, help, samples), as Prometheus reads them."""
    text = metrics.render().decode()
    return {
        family.name: (family.type, family.documentation, family.samples)
        for family in text_string_to_metric_families(text)
    }


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def test_counters_and_their_labels_read_back_as_written() -> None:
    metrics = Metrics()
    metrics.ingress.count("orders", "queued")
    metrics.ingress.count("orders", "queued")
    metrics.ingress.count(AWKWARD, "busy")
    metrics.rejected.labels(AWKWARD, "bad_token").inc()
    metrics.key_conflicts.labels("orders").inc()
    metrics.dead.labels("orders", "crm").inc(2)
    metrics.purged.inc(1_250_000)
    families = parsed(metrics)

    kind, _, samples = families["relay_events_received"]
    assert kind == "counter"
    assert value(samples, "relay_events_received_total", route="orders", result="queued") == 2
    assert value(samples, "relay_events_received_total", route=AWKWARD, result="busy") == 1
    _, _, samples = families["relay_rejected"]
    assert value(samples, "relay_rejected_total", route=AWKWARD, reason="bad_token") == 1
    _, _, samples = families["relay_deliveries_dead"]
    assert value(samples, "relay_deliveries_dead_total", route="orders", target="crm") == 2
    # A counter without labels is there from the start, and large figures
    # keep every digit through Go's exponent form (1.25e+06).
    _, _, samples = families["relay_purged_events"]
    assert value(samples, "relay_purged_events_total") == 1_250_000
    assert value(parsed(Metrics())["relay_purged_events"][2], "relay_purged_events_total") == 0
    # A labelled family nobody counted yet has its HELP and TYPE, no samples.
    assert families["relay_alerts"][0] == "counter"
    assert families["relay_alerts"][2] == []


def test_histograms_are_cumulative_with_count_and_sum() -> None:
    metrics = Metrics()
    for seconds in (0.0004, LATENCY_BUCKETS[2], 99.0):  # below, on and past the bounds
        metrics.ingress.observe_ack(seconds)
    metrics.count_attempt("orders", "crm", "success", 0.004)
    metrics.count_attempt("orders", "crm", "retry", 7.5)
    metrics.count_attempt("orders", AWKWARD, "dead", 31.0)
    families = parsed(metrics)

    kind, _, samples = families["relay_ingest_ack_seconds"]
    assert kind == "histogram"
    name = "relay_ingest_ack_seconds"
    assert value(samples, f"{name}_bucket", le="0.001") == 1
    assert value(samples, f"{name}_bucket", le=str(LATENCY_BUCKETS[2])) == 2  # le: <= bound
    assert value(samples, f"{name}_bucket", le="5.0") == 2
    assert value(samples, f"{name}_bucket", le="+Inf") == 3
    assert value(samples, f"{name}_count") == 3
    assert math.isclose(value(samples, f"{name}_sum"), 0.0004 + LATENCY_BUCKETS[2] + 99.0)

    _, _, samples = families["relay_attempt_duration_seconds"]
    name = "relay_attempt_duration_seconds"
    assert value(samples, f"{name}_bucket", target="crm", le="0.005") == 1
    assert value(samples, f"{name}_bucket", target="crm", le="10.0") == 2
    assert value(samples, f"{name}_bucket", target=AWKWARD, le="30.0") == 0
    assert value(samples, f"{name}_bucket", target=AWKWARD, le="+Inf") == 1
    assert value(samples, f"{name}_count", target="crm") == 2
    _, _, samples = families["relay_attempts"]
    assert (
        value(samples, "relay_attempts_total", route="orders", target="crm", outcome="retry") == 1
    )


def test_gauges_from_the_store_and_the_cluster() -> None:
    metrics = Metrics(cluster=True)
    metrics.commits.set_total(12)
    metrics.set_leading(True)
    # No snapshot (another instance of the cluster exports the queue): no queue gauges.
    assert "relay_deliveries" not in parsed(metrics)
    metrics.set_snapshot(
        StoreSnapshot(
            gauges=Gauges(
                counts={("crm", Status.PENDING): 4, ("gone", Status.DEAD): 1},
                oldest_pending_received_at=90.0,
                held={"crm": 3},
            ),
            targets={"crm": TargetState("crm", consecutive_failures=2)},
            paused=frozenset({"crm"}),
            configured=("crm", "mail"),
            now=100.5,
            index_behind=7,
            free_bytes=5 * 2**30,
        )
    )
    families = parsed(metrics)
    kind, _, samples = families["relay_store_commits"]
    assert (kind, value(samples, "relay_store_commits_total")) == ("counter", 12)
    assert value(families["relay_cluster_leader"][2], "relay_cluster_leader") == 1
    kind, _, samples = families["relay_deliveries"]
    assert kind == "gauge"
    assert value(samples, "relay_deliveries", target="crm", status="pending") == 4
    assert value(samples, "relay_deliveries", target="gone", status="dead") == 1  # unconfigured
    assert value(samples, "relay_deliveries", target="mail", status="in_flight") == 0
    assert (
        value(families["relay_oldest_pending_seconds"][2], "relay_oldest_pending_seconds") == 10.5
    )
    assert value(families["relay_target_paused"][2], "relay_target_paused", target="crm") == 1
    failures = families["relay_target_consecutive_failures"][2]
    assert value(failures, "relay_target_consecutive_failures", target="crm") == 2
    assert value(failures, "relay_target_consecutive_failures", target="mail") == 0
    assert value(families["relay_target_down"][2], "relay_target_down", target="mail") == 0
    held = families["relay_deliveries_held"][2]
    assert value(held, "relay_deliveries_held", target="crm") == 3
    assert value(held, "relay_deliveries_held", target="mail") == 0
    behind = families["relay_search_index_behind_events"][2]
    assert value(behind, "relay_search_index_behind_events") == 7
    free = families["relay_storage_free_bytes"][2]
    assert value(free, "relay_storage_free_bytes") == 5 * 2**30
    assert "relay_cluster_leader" not in parsed(Metrics())  # one process: not shown


@given(
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=0, max_value=10**18).map(float)
)
def test_numbers_are_written_as_the_prometheus_client_writes_them(figure: float) -> None:
    assert number(figure) == floatToGoString(figure)
