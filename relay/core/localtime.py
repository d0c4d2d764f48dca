"""Times as the operator reads and writes them: in the configured time zone
(`admin.timezone`, by default the system's), always with the UTC offset shown.

Stored times and the JSON of the API and of `--json` stay UTC ("…Z"): what
scripts read does not change with the server's zone. Only what a person reads
(the CLI's tables, the dashboard) and what a person types (`--since`,
`--until`, the dashboard's filters) are local.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from typing import TYPE_CHECKING, TypeAlias

from relay.core.closest import closest
from relay.core.units import parse_duration

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

# None is "the system's zone" (TZ, else /etc/localtime), read for each instant
# so that a summer and a winter time both get their own offset. zoneinfo is
# imported only when a zone is named: with its sysconfig, a quarter of a MiB
# that `relay serve` holds for good otherwise.
Zone: TypeAlias = "ZoneInfo | None"

WORDS = ("now", "today", "yesterday")


class UnknownZone(ValueError):
    """A time zone name the tz database does not know; the message suggests one."""


def zone_named(name: str | None) -> Zone:
    """The zone of an IANA name ("Europe/Moscow", "UTC"); None or "" is the system's."""
    if not name:
        return None
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        close = closest(name, sorted(_available()))
        hint = f" (did you mean {close}?)" if close else ""
        raise UnknownZone(
            f'unknown time zone {name!r}{hint}: expected an IANA name like "Europe/Moscow" or "UTC"'
        ) from None


@cache
def _available() -> frozenset[str]:
    import zoneinfo

    return frozenset(zoneinfo.available_timezones())


def _aware(moment: datetime, zone: Zone) -> datetime:
    """A naive local wall-clock time made aware in `zone` (None: the system's)."""
    if zone is None:
        return moment.astimezone()  # a naive datetime is taken as the system's local time
    return moment.replace(tzinfo=zone)


def in_zone(timestamp: float, zone: Zone) -> datetime:
    """A moment as the wall clock of `zone` reads it (None: the system's)."""
    if zone is None:
        return datetime.fromtimestamp(timestamp, UTC).astimezone()
    return datetime.fromtimestamp(timestamp, zone)


def format_local(timestamp: float, zone: Zone) -> str:
    """ "2026-12-02 15:00:03 +03:00": to the second, with the offset it had then."""
    moment = in_zone(timestamp, zone)
    offset = moment.strftime("%z")  # "+0300"
    return moment.strftime("%Y-%m-%d %H:%M:%S ") + f"{offset[:3]}:{offset[3:]}"


def format_iso_local(text: str | None, zone: Zone) -> str:
    """A view's UTC ISO time ("…Z") as `format_local` shows it; "-" for none."""
    if not text:
        return "-"
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    return format_local(moment.timestamp(), zone)


def zone_label(zone: Zone, now: float) -> str:
    """The zone's name and its offset now: "Europe/Moscow, UTC+03:00"."""
    moment = in_zone(now, zone)
    offset = moment.strftime("%z")
    name = zone.key if zone is not None else (moment.tzname() or "system time")
    return f"{name}, UTC{offset[:3]}:{offset[3:]}"


# The times relay can hold and show: from the Unix epoch to the last year a
# date can be written with (a float of 1e300 seconds is no time; NaN none either).
EARLIEST = 0.0
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def parse_local_instant(text: str, now: float, zone: Zone) -> float:
    """A point in time as a person writes it, as a Unix time.

    - an ISO 8601 time with an offset or Z: that instant;
    - a date ("2026-12-02") or a date and time without an offset
      ("2026-12-02T15:00", "2026-12-02 15:00"): local time in `zone`;
    - a time of day alone ("06:00", "6:30:15"): its most recent past
      occurrence, local time in `zone` (this morning, or yesterday's);
    - an age ("2h", "1d12h", "30m ago"): that long before `now`;
    - "now", "today" (local midnight), "yesterday" (the midnight before);
    - a Unix time in seconds, in digits ("1764680400", "1764680400.5").

    Raises ValueError with the accepted forms on anything else, and for a
    time before 1970 or after the year 9999.
    """
    try:
        moment = _parse(text.strip(), now, zone)
    except (ValueError, OverflowError):  # a date Python holds, but no timestamp: year 1
        moment = float("nan")
    if moment is None:
        raise ValueError(
            f"not a time: {text[:100]!r} (expected a date like 2026-12-02, a local time like"
            " 2026-12-02T15:00, a time of day like 06:00, an ISO time with an offset, an age"
            ' like "2h", "today" or "yesterday")'
        )
    if not EARLIEST <= moment <= LATEST:  # NaN is neither
        raise ValueError(f"{text[:100]!r} is not a time between 1970 and the year 9999")
    return moment


def _parse(value: str, now: float, zone: Zone) -> float | None:
    lowered = value.lower()
    if lowered in WORDS:
        if lowered == "now":
            return now
        midnight = datetime.combine(in_zone(now, zone).date(), time())
        if lowered == "yesterday":
            midnight = datetime.combine(midnight.date() - timedelta(days=1), time())
        return _aware(midnight, zone).timestamp()
    whole, point, fraction = value.partition(".")
    if _digits(whole) and (not point or _digits(fraction)):
        return float(value)  # digits alone: not "1_000", "1e300", "nan" or "inf"
    try:
        return now - parse_duration(lowered.removesuffix("ago").strip())
    except ValueError:
        pass
    of_day = _time_of_day(value)
    if of_day is not None:
        today = in_zone(now, zone).date()
        moment = _aware(datetime.combine(today, of_day), zone).timestamp()
        if moment > now:
            moment = _aware(datetime.combine(today - timedelta(days=1), of_day), zone).timestamp()
        return moment
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:
            parsed = datetime.combine(date.fromisoformat(value), time())
        except ValueError:
            return None
    if parsed.tzinfo is None:
        parsed = _aware(parsed, zone)
    return parsed.timestamp()


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _time_of_day(value: str) -> time | None:
    """ "06:00", "6:00", "06:00:30": hours, minutes, and maybe seconds."""
    parts = value.split(":")
    if not 2 <= len(parts) <= 3 or not all(_digits(part) and len(part) <= 2 for part in parts):
        return None
    hour, minute, second = (int(part) for part in (*parts, "0")[:3])
    if hour > 23 or minute > 59 or second > 59 or len(parts[1]) != 2:
        return None
    return time(hour, minute, second)
