"""relay.background.silence's rule, as tables: the hours of the week a silence
spans and how long it had lasted in each, the usual longest silence, the limit."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from relay.background.silence import (
    HOUR,
    LEARNT_AT_LEAST,
    hour_of_week,
    limit,
    silences,
    usual,
)

MOSCOW = ZoneInfo("Europe/Moscow")  # UTC+3, no summer time
KOLKATA = ZoneInfo("Asia/Kolkata")  # UTC+5:30


def at(text: str, zone: ZoneInfo = MOSCOW) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def test_the_hour_of_the_week_is_local() -> None:
    monday = hour_of_week(at("2026-12-07 00:10"), MOSCOW)  # a Monday
    assert monday[1] == 0
    assert hour_of_week(at("2026-12-13 23:59"), MOSCOW) == (monday[0], 167)  # its Sunday
    assert hour_of_week(at("2026-12-14 00:00"), MOSCOW) == (monday[0] + 1, 0)
    # 21:30 UTC on Sunday is Monday 00:30 in Moscow.
    assert hour_of_week(at("2026-12-13 21:30", ZoneInfo("UTC")), MOSCOW) == (monday[0] + 1, 0)


def test_a_silence_says_how_long_it_had_lasted_at_the_end_of_each_hour_it_spans() -> None:
    week, _ = hour_of_week(at("2026-12-07 12:00"), MOSCOW)
    found = list(silences(at("2026-12-07 22:30"), at("2026-12-08 01:10"), MOSCOW, week))
    assert found == [
        (week, 22, 0.5 * HOUR),
        (week, 23, 1.5 * HOUR),
        (week, 24, 2.5 * HOUR),
        (week, 25, 2 * HOUR + 40 * 60),
    ]
    # Hours before the first week kept are left out; the silence is counted whole.
    after = list(silences(at("2026-12-06 23:30"), at("2026-12-07 00:30"), MOSCOW, week))
    assert after == [(week, 0, HOUR)]


def test_local_hours_of_a_half_hour_zone() -> None:
    week, _ = hour_of_week(at("2026-12-07 12:00", KOLKATA), KOLKATA)
    found = list(
        silences(at("2026-12-07 09:45", KOLKATA), at("2026-12-07 10:15", KOLKATA), KOLKATA, week)
    )
    assert found == [(week, 9, 15 * 60), (week, 10, 30 * 60)]


@pytest.mark.parametrize(
    ("longest", "expected"),
    [
        ({}, None),
        ({9: 600.0}, 600.0),  # one week learnt
        ({6: 60.0, 7: 3600.0, 8: 120.0, 9: 90.0}, 120.0),  # one odd week does not count
        ({6: 60.0, 7: 120.0}, 120.0),  # the higher of the middle two
        ({5: 9999.0, 10: 9999.0}, None),  # older than four weeks, and this week's own
    ],
)
def test_the_usual_longest_silence_is_the_median_of_the_last_four_weeks(
    longest: dict[int, float], expected: float | None
) -> None:
    assert usual(longest, 10) == expected


@pytest.mark.parametrize(
    ("explicit", "known", "expected"),
    [
        (None, None, None),  # not judged: nothing learnt, nothing set
        (7200.0, None, 7200.0),  # its own setting, before any history
        (None, 3600.0, 3 * 3600.0),
        (None, 60.0, LEARNT_AT_LEAST),  # a busy route's minute is no news
        (7200.0, 11 * 3600.0, 33 * 3600.0),  # a night: the larger
        (7200.0, 600.0, 7200.0),
        (float("inf"), 600.0, float("inf")),  # "never"
    ],
)
def test_the_limit_is_the_larger_of_the_routes_own_and_the_learnt(
    explicit: float | None, known: float | None, expected: float | None
) -> None:
    assert limit(explicit, known, 3.0) == expected
