"""A record read from a row, declared once (relay.store.shape): the columns a
SELECT names and the mapper come from the same declaration."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from relay.store.columns import CLAIMED, DELIVERY, EVENT_DETAIL, TARGET_STATE
from relay.store.shape import GIVEN, Column, Columns, Shape, Written


@dataclass(frozen=True)
class Inner:
    a: int
    b: str


@dataclass(frozen=True)
class Outer:
    id: int
    name: str
    flag: bool
    pair: str
    inner: Inner | None
    given: tuple[int, ...] = ()
    left_out: str = "default"


def _pair(first: str, second: str) -> str:
    return f"{first}/{second}"


OUTER = Shape(
    Outer,
    id="id",
    name="name",
    flag=Column("flag", bool),
    pair=Columns(("first", "second"), _pair),
    inner=Shape(Inner, a="a", b="b").or_none("a"),
    given=GIVEN,
)


def test_the_columns_and_the_mapper_come_from_one_declaration() -> None:
    assert OUTER.columns == "id, name, flag, first, second, a, b"
    row = (7, "crm", 1, "x", "y", 3, "z")
    assert OUTER.from_row(row, given=(1, 2)) == Outer(7, "crm", True, "x/y", Inner(3, "z"), (1, 2))
    # The nested record is None where its column is NULL; a field left out keeps its default.
    assert OUTER.from_row((7, "crm", 0, "x", "y", None, None), given=()).inner is None


def test_a_column_read_twice_is_selected_once() -> None:
    shape = Shape(Inner, a="id", b=Column("id", str))
    assert shape.columns == "id"
    assert shape.from_row((5,)) == Inner(5, "5")


def test_a_given_field_must_be_given() -> None:
    with pytest.raises(TypeError):
        OUTER.from_row((7, "crm", 1, "x", "y", None, None))


def test_a_join_qualifies_each_column() -> None:
    on = Shape(Inner, a="a", b=Column("b", str)).on("e")
    assert on.columns == "e.a, e.b"
    assert on.columns_on("e") == "a, b"
    with pytest.raises(ValueError, match="not a column name"):
        Shape(Inner, a="length(body)", b="b").on("e")


def test_keyed_pairs_a_column_with_the_record() -> None:
    keyed = Shape(Inner, a="a", b="b").keyed("name")
    assert keyed.columns == "name, a, b"
    assert dict(map(keyed.from_row, [("x", 1, "y")])) == {"x": Inner(1, "y")}


def test_the_mapper_reads_as_a_hand_written_one() -> None:
    assert "status=Status(row[3])" in DELIVERY.source
    assert "payload=Payload(method=" in CLAIMED.source
    assert "if row[8] is not None else None" in TARGET_STATE.source
    assert EVENT_DETAIL.source.startswith(
        "def from_row(row, /, *, deliveries, attempts, log, resent_from, resent_as):"
    )


def test_a_claim_reads_its_delivery_then_its_event() -> None:
    delivery = CLAIMED.columns_on("d").split(", ")
    event = CLAIMED.columns_on("e").split(", ")
    assert CLAIMED.columns == ", ".join([*(f"d.{c}" for c in delivery), *(f"e.{c}" for c in event)])
    assert "resume_status" in delivery
    assert delivery.count("resume_status") == 1  # manual and resume_status read one column


def test_a_row_written_gives_both_backends_their_insert() -> None:
    written = Written("deliveries", id="bigint", target="text", due="float8")
    assert written.insert + written.row == "INSERT INTO deliveries (id, target, due) VALUES (?,?,?)"
    assert written.without("id").from_arrays(15) == (
        "INSERT INTO deliveries (target, due) SELECT * FROM unnest($15::text[], $16::float8[])"
    )
    assert len(written) == 3
