"""What the two backends' SQL differs by, in one place.

The SQL both backends run (relay.store.reads, relay.store.rows) is written
once, with SQLite's `?` placeholders; a Dialect turns it into one backend's:
numbered placeholders, a list of ids as one array parameter or as many, an
integer part, a float parameter where PostgreSQL cannot infer the type, and
how a content search is asked (SQLite's FTS5 index, PostgreSQL's trigram
indexes). Nothing here runs SQL: each backend runs the text with its driver.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from relay.store.base import TextSearch


def placeholders(count: int) -> str:
    return ",".join("?" * count)


def numbered(sql: str, start: int = 1) -> str:
    """`?` placeholders as PostgreSQL's `$1, $2...` (the shared SQL holds no
    `?` inside literals)."""
    counter = iter(range(start, start + sql.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(counter)}", sql)


@dataclass(frozen=True)
class SearchJoin:
    """An event listing's content search: the events joined with the search
    index (`source`), the column the page is ordered and cut by (`key`, the
    event id as the index walks it) and the conditions, with their values."""

    source: str
    key: str
    conditions: tuple[str, ...]
    params: tuple[Any, ...]


@dataclass(frozen=True)
class Dialect:
    name: str
    # $1, $2... rather than ?: PostgreSQL's.
    numbered: bool
    # The whole part of a non-negative number, as an integer (`{}` the expression).
    integer: str
    # A float parameter where the server cannot tell the type from the context.
    real: str
    # The smaller of two values (SQLite's scalar min(), PostgreSQL's LEAST).
    least: str
    # The larger of two values (SQLite's scalar max(), PostgreSQL's GREATEST).
    greatest: str
    # The deliveries whose event a search matches, as a condition on deliveries.
    search: Callable[[TextSearch], tuple[str, list[Any]]]
    # An event listing's search (SearchJoin).
    listing_search: Callable[[TextSearch], SearchJoin]

    def sql(self, text: str, start: int = 1) -> str:
        """`text`, written with `?`, in this backend's placeholders."""
        return numbered(text, start) if self.numbered else text

    def any_of(
        self, column: str, values: Sequence[Any], kind: str = "bigint"
    ) -> tuple[str, list[Any]]:
        """`column` is one of `values` (not empty): one array parameter of
        SQL type `kind` for PostgreSQL (one statement text whatever the
        count), one placeholder each for SQLite."""
        if self.numbered:
            return f"{column} = ANY(?::{kind}[])", [list(values)]
        return f"{column} IN ({placeholders(len(values))})", list(values)

    def none_of(
        self, column: str, values: Sequence[Any], kind: str = "text"
    ) -> tuple[str, list[Any]]:
        """`column` is none of `values` (as any_of; SQLite takes an empty list)."""
        if self.numbered:
            return f"{column} <> ALL(?::{kind}[])", [list(values)]
        return f"{column} NOT IN ({placeholders(len(values))})", list(values)


def match_expression(search: TextSearch) -> str:
    """An FTS5 query: each word a quoted phrase (a substring, for the trigram
    tokenizer) of the text column, all required; or the digits as one phrase."""
    if search.digits is not None:
        return "{digits}: " + _phrase(search.digits)
    return " AND ".join("{text}: " + _phrase(word) for word in search.words)


def _phrase(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _fts5_search(search: TextSearch) -> tuple[str, list[Any]]:
    return (
        "event_id IN (SELECT rowid FROM event_search WHERE event_search MATCH ?)",
        [match_expression(search)],
    )


def _fts5_listing(search: TextSearch) -> SearchJoin:
    # The index drives: CROSS JOIN keeps it the outer loop, walking its
    # matches newest first and stopping at the page's end.
    return SearchJoin(
        source="event_search CROSS JOIN events ON events.id = event_search.rowid",
        key="event_search.rowid",
        conditions=("event_search MATCH ?",),
        params=(match_expression(search),),
    )


def _like_conditions(search: TextSearch, prefix: str) -> tuple[list[str], list[Any]]:
    # LIKE '%...%' rather than strpos(): the pg_trgm GIN indexes answer it.
    conditions = []
    params: list[Any] = []
    if search.digits is not None:
        conditions.append(f"{prefix}digits LIKE ?")
        params.append(substring(search.digits))
    for word in search.words:
        conditions.append(f"{prefix}text LIKE ?")
        params.append(substring(word))
    return conditions, params


def _trigram_search(search: TextSearch) -> tuple[str, list[Any]]:
    conditions, params = _like_conditions(search, "")
    return (
        "event_id IN (SELECT event_id FROM event_search"
        f" WHERE {' AND '.join(conditions) or 'true'})",
        params,
    )


def _trigram_listing(search: TextSearch) -> SearchJoin:
    conditions, params = _like_conditions(search, "s.")
    return SearchJoin(
        source="events JOIN event_search s ON s.event_id = events.id",
        key="events.id",
        conditions=tuple(conditions),
        params=tuple(params),
    )


def substring(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, its own % _ and \\ taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


SQLITE = Dialect(
    name="sqlite",
    numbered=False,
    # Truncation, which is the floor for what it is asked of (never negative).
    integer="CAST({} AS INTEGER)",
    real="?",
    least="min",
    greatest="max",
    search=_fts5_search,
    listing_search=_fts5_listing,
)
POSTGRES = Dialect(
    name="postgres",
    numbered=True,
    # (A cast alone would round.)
    integer="floor({})::int",
    real="?::float8",
    least="LEAST",
    greatest="GREATEST",
    search=_trigram_search,
    listing_search=_trigram_listing,
)
