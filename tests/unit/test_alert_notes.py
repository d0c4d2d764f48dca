"""relay.background.alerts: which attempt says that a delivery keeps failing
(once, at the `delivery_failing_after`-th failed attempt of its cycle)."""

from __future__ import annotations

import pytest

from relay.background.alerts import _Window, alert_body, keeps_failing, notes_on
from relay.config import AlertsConfig
from relay.core.outcome import Outcome
from relay.core.payload import Payload
from relay.core.records import (
    AttemptKind,
    ClaimedDelivery,
    Dead,
    Delivered,
    FailureStreak,
    RetryAt,
    Transition,
    Waits,
)
from relay.delivery.scheduler import AttemptReport

CONFIG = AlertsConfig(target="ops", delivery_failing_after=5)
FAILED = Outcome.retry("HTTP 503", 503)
LATER = RetryAt(100.0)


def report(step: int | None, outcome: Outcome = FAILED, then: Transition = LATER) -> AttemptReport:
    delivery = ClaimedDelivery(
        id=7,
        event_id=3,
        route="leads",
        target="crm",
        attempts=9,
        attempts_in_cycle=(step or 1) - 1,
        manual=False,
        resume_status=None,
        resume_at=None,
        idempotency_key=None,
        received_at=0.0,
        payload=Payload("POST", "/", "", [], None, b""),
    )
    kind = AttemptKind.CYCLE if step is not None else AttemptKind.PROBE
    return AttemptReport(delivery, 10, kind, step, 16, outcome, then, 0.01, FailureStreak(0, 1))


@pytest.mark.parametrize(
    ("attempt", "said"),
    [
        (report(5), True),  # the fifth failed attempt of its cycle, retried on
        (report(4), False),
        (report(6), False),  # said already, at the fifth
        (report(5, then=Dead("gave up")), False),  # dead: the dead alert says it
        (report(5, Outcome.success(200), Delivered()), False),
        (report(None, then=Waits(100.0)), False),  # a probe is no step of the cycle
    ],
)
def test_a_delivery_keeps_failing_from_the_thresholds_attempt_of_its_cycle(
    attempt: AttemptReport, said: bool
) -> None:
    assert keeps_failing(attempt, CONFIG) is said
    kinds = [note["kind"] for note in notes_on(attempt, CONFIG)]
    assert ("keeps_failing" in kinds) is said


def test_bad_news_that_undoes_unsaid_good_news_says_again() -> None:
    """A route said silent in one alert, back and silent again within the
    next window: that alert says "silent again", not a second bare "silent"
    as if the route had never come back."""
    window = _Window()
    window.add({"kind": "back", "route": "shop", "silent_seconds": 120.0})
    window.add({"kind": "silent", "route": "shop", "silent_seconds": 70.0, "limit_seconds": 60.0})
    assert alert_body(window)["summary"] == (
        "relay: route shop is silent again (it was back in between)"
    )
    first = _Window()
    first.add({"kind": "silent", "route": "shop", "silent_seconds": 70.0, "limit_seconds": 60.0})
    assert alert_body(first)["summary"] == "relay: route shop is silent"


def test_one_waiting_delivery_is_said_in_the_singular() -> None:
    # "1 waiting deliveries now flow"
    window = _Window()
    window.add({"kind": "up", "target": "crm", "down_seconds": 60.0, "waited": 1})
    assert "1 waiting delivery now flows, oldest first" in alert_body(window)["text"]
