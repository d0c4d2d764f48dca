"""How many deliveries of a target a PostgreSQL instance may claim, rule by
rule (relay.store.postgres.cluster.room): the cluster's concurrency, its
paces, a down target's one probe, a receiver's throttle. The locks and reads around them are
tests/store/test_postgres.py's."""

from __future__ import annotations

import pytest

from relay.core.records import FRESH_PROBE_GAP
from relay.store.base import DownState
from relay.store.postgres.cluster import TargetLimits, room

NOW = 1000.0
PACED = TargetLimits(5, paces=(("target:crm", 0.2), ("group:bank", 1.0)))
DOWN_DUE = DownState(since=900.0, probe_at=NOW, probes=1)
DOWN_LATER = DownState(since=900.0, probe_at=NOW + 5, probes=1)
# Its probe an hour on, but a webhook arrived since the last probe (fresh evidence).
DOWN_EVIDENCE = DownState(900.0, NOW + 3600, 1, probed_at=NOW - 10, evidence_at=NOW - 1)


@pytest.mark.parametrize(
    ("limit", "rule", "leased", "next_at", "down", "expected", "throttled"),
    [
        # Concurrency: every instance's leases count.
        (10, TargetLimits(5), 0, {}, None, 5, None),
        (10, TargetLimits(5), 3, {}, None, 2, None),
        (1, TargetLimits(5), 3, {}, None, 1, None),
        (10, TargetLimits(5), 5, {}, None, 0, None),
        # Paces: one at a time, once every pace has come round.
        (10, PACED, 0, {"target:crm": NOW, "group:bank": NOW - 1}, None, 1, None),
        (10, PACED, 0, {"target:crm": NOW, "group:bank": NOW + 1}, None, 0, None),
        (10, PACED, 5, {"target:crm": NOW, "group:bank": NOW}, None, 0, None),
        # A down target: its probe, once due, and nothing of it leased.
        (10, TargetLimits(5), 0, {}, DOWN_DUE, 1, None),
        (10, TargetLimits(5), 1, {}, DOWN_DUE, 0, None),
        (10, TargetLimits(5), 0, {}, DOWN_LATER, 0, None),
        (10, TargetLimits(5), 0, {}, DOWN_EVIDENCE, 1, None),
        # A receiver's throttle: nothing while it holds, then one alone.
        (10, TargetLimits(5), 0, {}, None, 0, NOW + 2),
        (10, TargetLimits(5), 0, {}, None, 1, NOW),
        (10, TargetLimits(5), 1, {}, None, 0, NOW - 5),
    ],
)
def test_the_room_is_the_least_each_rule_allows(
    limit: int,
    rule: TargetLimits,
    leased: int,
    next_at: dict[str, float],
    down: DownState | None,
    expected: int,
    throttled: float | None,
) -> None:
    assert room(limit, rule, leased, next_at, down, NOW, throttled) == expected


@pytest.mark.parametrize(
    ("probe_at", "probed_at", "evidence_at", "due"),
    [
        (NOW + 3600, NOW - 60, None, NOW + 3600),  # no evidence: the backoff's
        (NOW + 3600, NOW - 60, NOW - 1, NOW - 1),  # evidence, long after the last probe
        (NOW + 3600, NOW - 1, NOW, NOW - 1 + FRESH_PROBE_GAP),  # just after it: the gap
        (NOW + 2, NOW - 1, NOW, NOW + 2),  # the backoff's is sooner
    ],
)
def test_fresh_evidence_brings_a_down_targets_probe_forward(
    probe_at: float, probed_at: float, evidence_at: float | None, due: float
) -> None:
    down = DownState(900.0, probe_at, 3, probed_at=probed_at, evidence_at=evidence_at)
    assert down.due == due
