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


def _to_zone(timestamp: float, zone: Zone) -> datetime:
    if zone is None:
        return datetime.fromtimestamp(timestamp, UTC).astimezone()
    return datetime.fromtimestamp(timestamp, zone)


def format_local(timestamp: float, zone: Zone) -> str:
    """ "2026-12-02 15:00:03 +03:00": to the second, with the offset it had then."""
    moment = _to_zone(timestamp, zone)
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
    moment = _to_zone(now, zone)
    offset = moment.strftime("%z")
    name = zone.key if zone is not None else (moment.tzname() or "system time")
    return f"{name}, UTC{offset[:3]}:{offset[3:]}"


def parse_local_instant(text: str, now: float, zone: Zone) -> float:
    """A point in time as a person writes it, as a Unix time.

    - an ISO 8601 time with an offset or Z: that instant;
    - a date ("2026-12-02") or a date and time without an offset
      ("2026-12-02T15:00", "2026-12-02 15:00"): local time in `zone`;
    - an age ("2h", "1d12h", "30m ago"): that long before `now`;
    - "now", "today" (local midnight), "yesterday" (the midnight before);
    - a Unix time in seconds ("1764680400").

    Raises ValueError with the accepted forms on anything else.
    """
    value = text.strip()
    lowered = value.lower()
    if lowered in WORDS:
        if lowered == "now":
            return now
        midnight = datetime.combine(_to_zone(now, zone).date(), time())
        if lowered == "yesterday":
            midnight = datetime.combine(midnight.date() - timedelta(days=1), time())
        return _aware(midnight, zone).timestamp()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return now - parse_duration(lowered.removesuffix("ago").strip())
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:
            moment = datetime.combine(date.fromisoformat(value), time())
        except ValueError:
            raise ValueError(
                f"not a time: {text!r} (expected a date like 2026-12-02, a local time like"
                ' 2026-12-02T15:00, an ISO time with an offset, an age like "2h", "today"'
                ' or "yesterday")'
            ) from None
    if moment.tzinfo is None:
        moment = _aware(moment, zone)
    return moment.timestamp()
