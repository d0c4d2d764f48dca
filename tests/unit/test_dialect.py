"""relay.store.dialect and the shared reads' SQL: one text, written with `?`,
turned into each backend's. The contract suite runs the SQL on both; this
pins what the text becomes."""

from __future__ import annotations

import pytest

from relay.store.base import EventQuery, Selection, Status, TextSearch
from relay.store.dialect import POSTGRES, SQLITE, match_expression, numbered, substring
from relay.store.reads import event_listing, purgeable, selection_where


@pytest.mark.parametrize(
    ("sql", "start", "expected"),
    [
        ("SELECT 1", 1, "SELECT 1"),
        ("a = ? AND b = ?", 1, "a = $1 AND b = $2"),
        ("x < ?::float8 OR ? ", 3, "x < $3::float8 OR $4 "),
    ],
)
def test_numbered_counts_the_placeholders_in_order(sql: str, start: int, expected: str) -> None:
    assert numbered(sql, start) == expected


def test_an_id_list_is_one_array_on_postgres_and_a_placeholder_each_on_sqlite() -> None:
    assert SQLITE.any_of("id", [3, 1, 2]) == ("id IN (?,?,?)", [3, 1, 2])
    assert POSTGRES.any_of("id", [3, 1, 2]) == ("id = ANY(?::bigint[])", [[3, 1, 2]])
    assert SQLITE.none_of("target", ["a"]) == ("target NOT IN (?)", ["a"])
    assert POSTGRES.none_of("target", ["a"]) == ("target <> ALL(?::text[])", [["a"]])


@pytest.mark.parametrize(
    ("text", "pattern"),
    [("79991234567", "%79991234567%"), ("50%_off\\", "%50\\%\\_off\\\\%")],
)
def test_a_like_pattern_takes_the_text_literally(text: str, pattern: str) -> None:
    assert substring(text) == pattern


def test_an_fts5_query_quotes_each_word() -> None:
    assert match_expression(TextSearch(words=("Анна", 'say "hi"'))) == (
        '{text}: "Анна" AND {text}: "say ""hi"""'
    )
    assert match_expression(TextSearch(digits="7999")) == '{digits}: "7999"'


def test_a_listing_is_one_text_in_both_dialects_but_its_search() -> None:
    query = EventQuery(status=Status.DEAD, route="leads", before_id=90, limit=20)
    sql, params = event_listing(SQLITE, query)
    assert (sql, params) == event_listing(POSTGRES, query)
    assert params == ["leads", 90, "dead", 20]
    assert sql.endswith("ORDER BY events.id DESC LIMIT ?")


def test_a_listing_search_is_driven_by_each_backend_index() -> None:
    query = EventQuery(search=TextSearch(digits="7999"), before_id=90)
    sqlite_sql, sqlite_params = event_listing(SQLITE, query)
    postgres_sql, postgres_params = event_listing(POSTGRES, query)
    assert "event_search MATCH ?" in sqlite_sql
    assert sqlite_sql.endswith("ORDER BY event_search.rowid DESC LIMIT ?")
    assert sqlite_params == ['{digits}: "7999"', 90, 50]
    assert "s.digits LIKE ?" in postgres_sql
    assert postgres_params == ["%7999%", 90, 50]


def test_a_selection_and_retention_differ_only_where_the_dialect_says() -> None:
    selection = Selection(status=Status.DEAD, target="crm", ids=(4, 5))
    assert selection_where(selection, SQLITE) == (
        "status = ? AND target = ? AND id IN (?,?)",
        ["dead", "crm", 4, 5],
    )
    assert selection_where(selection, POSTGRES) == (
        "status = ? AND target = ? AND id = ANY(?::bigint[])",
        ["dead", "crm", [4, 5]],
    )
    sqlite_where, params = purgeable(SQLITE, {"leads": 10.0}, 20.0)
    postgres_where, same = purgeable(POSTGRES, {"leads": 10.0}, 20.0)
    assert params == same == [20.0, "leads", 10.0, 20.0]
    assert postgres_where == sqlite_where.replace("THEN ?", "THEN ?::float8").replace(
        "ELSE ?", "ELSE ?::float8"
    )
