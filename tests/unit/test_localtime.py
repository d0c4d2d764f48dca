"""Times as an operator in Moscow types and reads them (relay.core.localtime).

Before: only "…Z"/"+03:00" ISO times, Unix times and ages were accepted
("2026-12-02" and "2026-12-02T15:00" were refused), and every time was shown
in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from relay.core.localtime import (
    UnknownZone,
    format_iso_local,
    format_local,
    parse_local_instant,
    zone_label,
    zone_named,
)

MOSCOW = zone_named("Europe/Moscow")  # UTC+03:00 all year since 2014
BERLIN = zone_named("Europe/Berlin")  # +01:00 in winter, +02:00 in summer
# 2026-12-03 18:30:00 UTC, 21:30 in Moscow
NOW = datetime(2026, 12, 3, 18, 30, tzinfo=UTC).timestamp()


def utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-02", utc(2026, 12, 1, 21)),  # local midnight
        ("2026-12-02T15:00", utc(2026, 12, 2, 12)),
        ("2026-12-02 15:00", utc(2026, 12, 2, 12)),
        ("2026-12-02T15:00:30", utc(2026, 12, 2, 12, 0, 30)),
        ("2026-12-02T15:00Z", utc(2026, 12, 2, 15)),
        ("2026-12-02T15:00+05:00", utc(2026, 12, 2, 10)),
        ("2h", NOW - 7200),
        ("2h ago", NOW - 7200),
        ("1d12h", NOW - 36 * 3600),
        ("now", NOW),
        ("today", utc(2026, 12, 2, 21)),  # Moscow's midnight of the 3rd
        ("Yesterday", utc(2026, 12, 1, 21)),
        ("1764680400", 1764680400.0),
        ("1764680400.25", 1764680400.25),
        # A time of day alone: its most recent past occurrence (it is 21:30 there).
        ("06:00", utc(2026, 12, 3, 3)),
        ("21:30", NOW),
        ("6:30:15", utc(2026, 12, 3, 3, 30, 15)),
        ("23:00", utc(2026, 12, 2, 20)),  # not yet today: yesterday's
    ],
)
def test_every_form_a_person_writes(text: str, expected: float) -> None:
    assert parse_local_instant(text, NOW, MOSCOW) == expected


def test_a_local_time_takes_the_offset_of_its_own_date() -> None:
    assert parse_local_instant("2026-07-01T12:00", NOW, BERLIN) == utc(2026, 7, 1, 10)
    assert parse_local_instant("2026-01-01T12:00", NOW, BERLIN) == utc(2026, 1, 1, 11)


@pytest.mark.parametrize(
    "text",
    # Python's float() reads "nan", "inf", "1e300" and "1_000" (Unix time 1000):
    # a time is digits, or one of the forms above.
    [
        *("last tuesday", "2026-13-01", "", "yesterday-ish", "2x", "nan", "inf", "-inf"),
        *("1e300", "1_000", "-5", "24:00", "6:5", "06:00:00:00", "\x00", "１７６４６８０４００"),
    ],
)
def test_anything_else_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="expected a date like 2026-12-02"):
        parse_local_instant(text, NOW, MOSCOW)


@pytest.mark.parametrize("text", ["99999999999999999999d", "0001-01-01", "1969-06-01T00:00Z"])
def test_a_time_relay_cannot_hold_is_said_so(text: str) -> None:
    with pytest.raises(ValueError, match="not a time between 1970 and the year 9999"):
        parse_local_instant(text, NOW, MOSCOW)


def test_shown_with_the_offset_it_had_then() -> None:
    assert format_local(utc(2026, 12, 2, 12), MOSCOW) == "2026-12-02 15:00:00 +03:00"
    assert format_local(utc(2026, 7, 1, 10), BERLIN) == "2026-07-01 12:00:00 +02:00"
    assert format_local(utc(2026, 1, 1, 11), BERLIN) == "2026-01-01 12:00:00 +01:00"
    assert format_iso_local("2026-12-02T12:00:00.000Z", MOSCOW) == "2026-12-02 15:00:00 +03:00"
    assert format_iso_local(None, MOSCOW) == "-"
    assert zone_label(MOSCOW, NOW) == "Europe/Moscow, UTC+03:00"


def test_an_unknown_zone_suggests_the_right_one() -> None:
    with pytest.raises(UnknownZone, match=r"did you mean Europe/Moscow\?"):
        zone_named("Europe/Moskow")
    assert zone_named("") is None  # the system's
