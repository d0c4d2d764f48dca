"""What relay accepts from a person — through the admin API, the dashboard or
the CLI: numbers, ids, names and times, each checked here so that every bad
value is an answer that names its field (a 400, or the CLI's one line) — never
a 500 or a traceback (`"²".isdigit()` is true, `int("²")` fails) nor a 503 or a
"database error" (an id too large for SQLite's 64-bit integers)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from relay.core.closest import closest
from relay.core.localtime import Zone, parse_local_instant

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


# Ids one request may name (a bulk action, the dashboard's ticked rows): more
# would be work on the event loop that grows with what a caller sends.
MAX_IDS = 10_000


def row_ids(values: Sequence[Any], field: str, *, indexed: bool = False) -> tuple[int, ...]:
    """Ids as the admin API takes them (BadRequest, naming `field`, or
    `field[n]` when `indexed`, for any other), at most MAX_IDS of them."""
    if len(values) > MAX_IDS:
        raise BadRequest(
            f"{field}: {len(values)} ids: at most {MAX_IDS} at once (act in parts, or by filter)"
        )
    return tuple(
        row_id(value, f"{field}[{n}]" if indexed else field) for n, value in enumerate(values)
    )


def optional_text(value: Any, field: str) -> str | None:
    """A filter's text (a route, a target, an idempotency key): a string, or
    absent. A control character is refused: no name holds one, a key is
    never looked up by one (PostgreSQL cannot even take a NUL as text)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{field}: expected a string")
    control = next((c for c in value if not c.isprintable() and c != "\t"), None)
    if control is not None:
        raise BadRequest(f"{field}: holds the control character U+{ord(control):04X}")
    return value


def instant(value: Any, field: str, now: float, zone: Zone = None) -> float | None:
    """A time as a person writes it (relay.core.localtime: a date, a local or ISO
    time, an age like "2h", "yesterday"), or absent.

    Never ignored when it does not parse: a requeue "since" that is dropped
    would requeue everything."""
    if value is None or value == "":
        return None
    # A time holds no control character (a trailing NUL was read past).
    text = optional_text(value, field) if isinstance(value, str) else str(value)
    try:
        return parse_local_instant(text or "", now, zone)
    except ValueError as problem:
        raise BadRequest(f"{field}: {problem}") from None


def failing(value: Any, field: str, threshold: int) -> int | None:
    """The "keeps failing" filter: deliveries pending after at least N
    attempts of their cycle. `true` is what relay calls keeps failing
    (`threshold`, [alerts] delivery_failing_after); a whole number, that
    many (1: past their first attempt); absent, no filter."""
    if value is None or value == "" or value is False:
        return None
    if value is True or value == "true":
        return threshold
    if isinstance(value, str) and not value.isdigit():
        raise BadRequest(f"{field}: expected true or a number of attempts, not {value!r}")
    return whole_number(value, field, minimum=1, maximum=1_000_000)


def unknown_name(kind: str, value: str, known: Iterable[str]) -> str:
    """ "no route tidla (did you mean tilda?); the routes are: shop, tilda" """
    names = sorted(set(known))
    close = closest(value, names)
    hint = f" (did you mean {close}?)" if close else ""
    listed = f"the {kind}es are" if kind.endswith("s") else f"the {kind}s are"
    listing = f"{listed}: {', '.join(names)}" if names else f"no {kind} is configured"
    return f"no {kind} {value[:100]}{hint}; {listing}"


def known_name(value: Any, field: str, kind: str, known: Iterable[str]) -> str | None:
    """A route, target or status name that exists, or absent (None, "").

    A typo is an error naming the valid ones, never a filter that silently
    matches nothing ("(none)", "requeued 0")."""
    text = optional_text(value, field)
    if text is None:
        return None
    names = set(known)
    if text not in names:
        raise BadRequest(f"{field}: {unknown_name(kind, text, names)}")
    return text
