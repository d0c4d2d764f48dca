"""How many deliveries of a target a PostgreSQL instance may claim, rule by
rule (relay.store.postgres.cluster.room): the cluster's concurrency, its
paces, a down target's one probe, a receiver's throttle. The locks and reads around them are
tests/store/test_postgres.py's."""

from __future__ import annotations

import pytest

from relay.store.base import DownState
from relay.store.postgres.cluster import TargetLimits, room

NOW = 1000.0
PACED = TargetLimits(5, paces=(("target:crm", 0.2), ("group:bank", 1.0)))
DOWN_DUE = DownState(since=900.0, probe_at=NOW, probes=1)
DOWN_LATER = DownState(since=900.0, probe_at=NOW + 5, probes=1)


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
