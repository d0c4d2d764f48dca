"""relay.store.health: what one attempt changes of its target's row, as a table."""

from __future__ import annotations

import pytest

from relay.store.base import AttemptRecord, FailureStreak, Hold
from relay.store.health import (
    SUCCESS_SHOWN_WITHIN,
    HealthChange,
    TargetHealth,
    fails_alone,
    health_after,
)

NOW = 1_000.0
OK = AttemptRecord(1, NOW, 0.1, "success", 200)
DOWN = AttemptRecord(1, NOW, 0.1, "retry", 503, "HTTP 503")
BAD = AttemptRecord(1, NOW, 0.1, "fail", 400, "HTTP 400")
UNSENDABLE = AttemptRecord(1, NOW, 0.0, "fail", None, "template", target_at_fault=False)
HOLD = Hold(down_after=3, probe_at=NOW + 60)
PROBE = Hold(down_after=3, probe_at=NOW + 120, probe=True)


@pytest.mark.parametrize(
    ("attempt", "hold", "row", "expected"),
    [
        # The event's own fault: nothing learnt about the target.
        (UNSENDABLE, None, (4, 4, None, 0, 9, False), HealthChange(FailureStreak(4, 4))),
        (
            OK,
            None,
            (2, 2, None, 0, 9, False),
            HealthChange(
                FailureStreak(2, 0),
                {
                    "last_success_at": NOW,
                    "consecutive_failures": 0,
                    "down_streak": 0,
                    "successes": 10,
                },
            ),
        ),
        # A 4xx is about the payload: the streak grows, "down" restarts.
        (
            BAD,
            HOLD,
            (2, 2, None, 0, 9, False),
            HealthChange(
                FailureStreak(2, 3),
                {
                    "last_error_at": NOW,
                    "last_error": "HTTP 400",
                    "consecutive_failures": 3,
                    "down_streak": 0,
                },
            ),
        ),
        # The down_after-th "down" answer in a row: the target goes down.
        (
            DOWN,
            HOLD,
            (2, 2, None, 0, 9, False),
            HealthChange(
                FailureStreak(2, 3, went_down=True, down=True),
                {
                    "last_error_at": NOW,
                    "last_error": "HTTP 503",
                    "consecutive_failures": 3,
                    "down_streak": 3,
                    "down_since": NOW,
                    "probe_at": NOW + 60,
                    "probes": 0,
                    "probe_delivery": 7,
                },
            ),
        ),
        # A failed probe: the next one is set, and counted.
        (
            DOWN,
            PROBE,
            (5, 5, 900.0, 1, 9, False),
            HealthChange(
                FailureStreak(5, 6, down=True),
                {
                    "last_error_at": NOW,
                    "last_error": "HTTP 503",
                    "consecutive_failures": 6,
                    "down_streak": 6,
                    "probe_at": NOW + 120,
                    "probes": 2,
                    "probe_delivery": 7,
                },
            ),
        ),
        # Any answer about the payload brings a down target up.
        (
            OK,
            PROBE,
            (5, 5, 900.0, 1, 9, False),
            HealthChange(
                FailureStreak(5, 0, came_up=True, down_for=100.0),
                {
                    "last_success_at": NOW,
                    "consecutive_failures": 0,
                    "down_streak": 0,
                    "successes": 10,
                    "down_since": None,
                    "probe_at": None,
                    "probes": 0,
                    "probe_delivery": None,
                },
                count_waiting=True,
            ),
        ),
        # A payload failing alone (it failed, others were delivered since):
        # its failure is counted, but it neither grows the "down" streak nor
        # makes the target down.
        (
            DOWN,
            HOLD,
            (2, 2, None, 0, 9, True),
            HealthChange(
                FailureStreak(2, 3),
                {
                    "last_error_at": NOW,
                    "last_error": "HTTP 503",
                    "consecutive_failures": 3,
                    "down_streak": 2,
                },
            ),
        ),
    ],
)
def test_health_after_one_attempt(
    attempt: AttemptRecord,
    hold: Hold | None,
    row: tuple[int, int, float | None, int, int, bool],
    expected: HealthChange,
) -> None:
    *health, alone = row
    change = health_after(attempt, NOW, hold, TargetHealth(*health), alone=alone, delivery_id=7)
    assert change == expected


@pytest.mark.parametrize(
    ("flagged", "seen", "successes", "alone"),
    [
        (False, None, 5, False),  # its first failure: nothing to compare with
        (False, 5, 5, False),  # nothing delivered since its last failure
        (False, 4, 5, True),  # the target delivered another since
        (True, 5, 5, True),  # once alone, alone
    ],
)
def test_a_delivery_fails_alone_once_others_were_delivered_since_its_last_failure(
    flagged: bool, seen: int | None, successes: int, alone: bool
) -> None:
    assert fails_alone(flagged=flagged, seen=seen, successes=successes) is alone


@pytest.mark.parametrize(
    ("row", "now", "writes"),
    [
        # After a success shown less than SUCCESS_SHOWN_WITHIN ago: nothing.
        ((0, 0, None, 0, 9, NOW - 0.5), NOW, False),
        # The time shown would lag more: it is written, and the count.
        ((0, 0, None, 0, 9, NOW - SUCCESS_SHOWN_WITHIN), NOW, True),
        # A failure since (of any delivery, alone or not): the count must grow,
        # for the deliveries that failed (fails_alone).
        ((1, 0, None, 0, 9, NOW - 0.5), NOW, True),
        ((1, 1, None, 0, 9, NOW - 0.5), NOW, True),
        # Shown ahead of now (the clock stepped back, another instance's runs
        # ahead): written, or it would stay in the future until then.
        ((0, 0, None, 0, 9, NOW + 3600), NOW, True),
        # Never a success yet, or down: written.
        ((0, 0, None, 0, 0, None), NOW, True),
        ((0, 0, NOW - 60, 1, 9, NOW - 0.5), NOW, True),
    ],
)
def test_a_success_after_a_success_changes_nothing_to_write(
    row: tuple[int, int, float | None, int, int, float | None], now: float, writes: bool
) -> None:
    health = TargetHealth(*row)
    change = health_after(OK, now, None, health, delivery_id=7)
    assert bool(change.columns) is writes
    assert change.streak.after == 0
    if writes:
        assert change.columns["successes"] == health.successes + 1


def test_a_delivery_failing_again_after_unwritten_successes_still_fails_alone() -> None:
    # The row as the rule leaves it, attempt after attempt: a poison payload
    # fails, others are delivered (the first success is written, the next ones
    # change nothing), it fails again: the count grew since, so it fails alone.
    health = TargetHealth(successes=5, last_success_at=NOW - 0.1)
    health = health.written(health_after(DOWN, NOW, HOLD, health, delivery_id=7).columns)
    seen = health.successes
    for n in range(5):
        health = health.written(health_after(OK, NOW + n / 10, HOLD, health).columns)
    assert health.successes == 6  # grew once, not five times
    assert fails_alone(flagged=False, seen=seen, successes=health.successes)
