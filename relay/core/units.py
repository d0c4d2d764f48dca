"""Durations and sizes as people write them in a config file, and back; counts
said the way a person reads them ("1 attempt", "2 attempts")."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_SIZE = re.compile(r"(\d+)\s*([a-z]*)")


def parse_duration(text: str) -> float:
    """Seconds in "1ms", "2s", "5m", "1h", "1d" or a sum like "1h30m".

    Raises ValueError on anything else, including an empty string.
    """
    compact = text.strip().replace(" ", "")
    if not compact:
        raise ValueError("empty duration")
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(compact):
        if match.start() != position:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(compact):
        raise ValueError(f"not a duration: {text!r}")
    return total


def parse_size(text: str) -> int:
    """Bytes in "512", "64KiB", "1MiB", "10MB"."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """A short human form: "1ms", "2s", "1m04s", "9h06m", "2d03h".

    Precision shrinks as the value grows; a schedule reads better as
    "9h06m" than as "9h06m08s".
    """
    if seconds < 1:
        millis = round(seconds * 1000)
        return f"{millis}ms" if millis < 1000 else "1s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


def format_instant(timestamp: float) -> str:
    """UTC ISO 8601 with milliseconds: "2026-12-01T10:00:00.000Z"."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def count(number: int | str, noun: str, plural: str | None = None) -> str:
    """`number` and `noun`, the noun in the plural unless the number is one."""
    one = str(number) == "1"
    return f"{number} {noun if one else plural or noun + 's'}"
