"""relay.store.health: what one attempt changes of its target's row, as a table."""

from __future__ import annotations

import pytest

from relay.store.base import AttemptRecord, FailureStreak, Hold
from relay.store.health import HealthChange, health_after

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
        (UNSENDABLE, None, (4, 4, None, 0), HealthChange(FailureStreak(4, 4))),
        (
            OK,
            None,
            (2, 2, None, 0),
            HealthChange(
                FailureStreak(2, 0),
                {"last_success_at": NOW, "consecutive_failures": 0, "down_streak": 0},
            ),
        ),
        # A 4xx is about the payload: the streak grows, "down" restarts.
        (
            BAD,
            HOLD,
            (2, 2, None, 0),
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
            (2, 2, None, 0),
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
                },
            ),
        ),
        # A failed probe: the next one is set, and counted.
        (
            DOWN,
            PROBE,
            (5, 5, 900.0, 1),
            HealthChange(
                FailureStreak(5, 6, down=True),
                {
                    "last_error_at": NOW,
                    "last_error": "HTTP 503",
                    "consecutive_failures": 6,
                    "down_streak": 6,
                    "probe_at": NOW + 120,
                    "probes": 2,
                },
            ),
        ),
        # Any answer about the payload brings a down target up.
        (
            OK,
            PROBE,
            (5, 5, 900.0, 1),
            HealthChange(
                FailureStreak(5, 0, came_up=True, down_for=100.0),
                {
                    "last_success_at": NOW,
                    "consecutive_failures": 0,
                    "down_streak": 0,
                    "down_since": None,
                    "probe_at": None,
                    "probes": 0,
                },
                count_waiting=True,
            ),
        ),
    ],
)
def test_health_after_one_attempt(
    attempt: AttemptRecord,
    hold: Hold | None,
    row: tuple[int, int, float | None, int],
    expected: HealthChange,
) -> None:
    before, down_streak, down_since, probes = row
    change = health_after(
        attempt,
        NOW,
        hold,
        before=before,
        down_streak=down_streak,
        down_since=down_since,
        probes=probes,
    )
    assert change == expected
