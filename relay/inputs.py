"""What relay accepts from a person — through the admin API, the dashboard or
the CLI: numbers, ids, names and times, each checked here so that every bad
value is an answer that names its field (a 400, or the CLI's one line) — never
a 500 or a traceback (`"²".isdigit()` is true, `int("²")` fails) nor a 503 or a
"database error" (an id too large for SQLite's 64-bit integers)."""

from __future__ import annotations

from typing import Any

from relay.units import parse_instant

# SQLite's INTEGER is a signed 64-bit number: no row has an id above this.
MAX_ID = 2**63 - 1


class BadRequest(Exception):
    """Bad input from the operator: the message starts with the field's name."""


def whole_number(value: Any, field: str, *, minimum: int = 1, maximum: int = MAX_ID) -> int:
    """An integer written in ASCII digits (a JSON integer is accepted too), in range."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        number = int(value)
    else:
        number = None
    if number is None or not minimum <= number <= maximum:
        raise BadRequest(f"{field}: expected a whole number from {minimum} to {maximum}")
    return number


def row_id(value: Any, field: str) -> int:
    return whole_number(value, field, minimum=1, maximum=MAX_ID)


def optional_text(value: Any, field: str) -> str | None:
    """A name such as a route or a target: a string, or absent."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{field}: expected a string")
    return value


def instant(value: Any, field: str, now: float) -> float | None:
    """A time as a person writes it (ISO 8601, a Unix time, an age like "2h"), or absent.

    Never ignored when it does not parse: a requeue "since" that is dropped
    would requeue everything."""
    if value is None or value == "":
        return None
    try:
        return parse_instant(str(value), now)
    except ValueError:
        raise BadRequest(
            f'{field}: expected an ISO 8601 time, a Unix time or an age like "2h"'
        ) from None
