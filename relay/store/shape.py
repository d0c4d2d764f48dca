"""A record read from a row, declared once: where each of its fields comes from.

A Shape names, field by field, what a record is read from:

    "status"                          a column (or any SQL expression), as it is
    Column("status", Status)          a column, converted
    Columns(("a", "b"), combine)      several columns made into one value
    PAYLOAD                           another Shape: a record inside the record
    DOWN.or_none("down_since")        that, or None where the column is NULL
    GIVEN                             the caller's (what another query read)

From the declaration come the columns a SELECT or a RETURNING names
(`shape.columns`: each column once, in the order of the fields) and
`shape.from_row`, which makes the record from such a row. Both backends'
rows fit (a tuple, sqlite3's, asyncpg's Record): the function reads them by
position, the positions being those of `shape.columns`.

`from_row` is written once, when the Shape is declared, as dataclasses
writes a class's `__init__`; `shape.source` shows it:

    def from_row(row, /):
        return DeliveryView(id=row[0], event_id=row[1], target=row[2],
                            status=Status(row[3]), ...)

so reading a row costs what the hand-written mapper did (a claim reads one
per delivery it leases). A field left out keeps its record's default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

T = TypeVar("T")


class Row(Protocol):
    """A result row of either backend (a tuple, sqlite3's, asyncpg's Record)."""

    def __getitem__(self, index: int, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class Column:
    """A field read from one column (an SQL expression), through `convert`."""

    def __init__(self, sql: str, convert: Callable[[Any], Any]) -> None:
        self.sql = sql
        self.convert = convert


class Columns:
    """A field made of several columns: `combine` gets their values, in order."""

    def __init__(self, sql: tuple[str, ...], combine: Callable[..., Any]) -> None:
        self.sql = sql
        self.combine = combine


class _Given:
    def __repr__(self) -> str:
        return "GIVEN"


# A field the caller passes to from_row by its name (read by another query).
GIVEN = _Given()


class OrNone:
    """A nested record, or None where column `sql` is NULL."""

    def __init__(self, shape: Shape[Any], sql: str) -> None:
        self.shape = shape
        self.sql = sql


# What a field of a Shape may be read from.
FieldSpec: TypeAlias = "str | Column | Columns | Shape[Any] | OrNone | _Given"


class Shape(Generic[T]):
    """Record `make` read from a row, each field from what `fields` names."""

    def __init__(self, make: Callable[..., T], /, **fields: FieldSpec) -> None:
        self.make = make
        self.fields: dict[str, FieldSpec] = fields
        writer = _Writer()
        body = writer.record(self)
        self.column_list = tuple(writer.columns)
        self.columns = ", ".join(self.column_list)
        if clash := set(writer.given) & set(writer.namespace):
            raise ValueError(f"a given field is named as a function it calls: {clash}")
        given = f", *, {', '.join(writer.given)}" if writer.given else ""
        self.source = f"def from_row(row, /{given}):\n    return {body}\n"
        name = getattr(make, "__name__", "record")
        # As dataclasses writes a class's __init__.
        exec(compile(self.source, f"<from_row of {name}>", "exec"), writer.namespace)
        self.from_row: Callable[..., T] = writer.namespace["from_row"]

    def on(self, alias: str) -> Shape[T]:
        """The same record read from a table named `alias` in a join: each
        column qualified (`e.route`)."""
        return Shape(
            self.make, **{name: _qualified(spec, alias) for name, spec in self.fields.items()}
        )

    def columns_on(self, alias: str) -> str:
        """The columns read from `alias` (a join's table), unqualified: what
        the statement that makes that table's rows must return."""
        prefix = alias + "."
        return ", ".join(c.removeprefix(prefix) for c in self.column_list if c.startswith(prefix))

    def getter(self, sql: str) -> Callable[[Row], Any]:
        """Column `sql` of a row of this shape (read before the record is made)."""
        return itemgetter(self.column_list.index(sql))

    def or_none(self, sql: str) -> OrNone:
        """This record, or None where column `sql` is NULL (a field's spec)."""
        return OrNone(self, sql)

    def keyed(self, sql: str) -> Shape[tuple[Any, T]]:
        """(column `sql`, the record) pairs: dict(map(shape.keyed("id").from_row, rows))."""
        return Shape(_pair, key=sql, value=self)


def _pair(key: Any, value: T) -> tuple[Any, T]:
    return key, value


class _Writer:
    """Writes a from_row function's body: the columns it reads, the names it calls."""

    def __init__(self) -> None:
        self.columns: list[str] = []
        self.namespace: dict[str, Any] = {}
        self.given: list[str] = []

    def column(self, sql: str) -> str:
        if sql not in self.columns:
            self.columns.append(sql)
        return f"row[{self.columns.index(sql)}]"

    def name(self, value: Callable[..., Any]) -> str:
        """The name `value` is called by: its own (Status, bytes), made unique."""
        own = getattr(value, "__name__", "")
        name = own if own.isidentifier() and not own.startswith("<") else "convert"
        if self.namespace.get(name, value) is not value or name == "row":
            name = f"{name}_{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def record(self, shape: Shape[Any]) -> str:
        values = ", ".join(
            f"{field}={self.field(field, spec)}" for field, spec in shape.fields.items()
        )
        return f"{self.name(shape.make)}({values})"

    def field(self, field: str, spec: FieldSpec) -> str:
        if isinstance(spec, str):
            return self.column(spec)
        if isinstance(spec, Column):
            return f"{self.name(spec.convert)}({self.column(spec.sql)})"
        if isinstance(spec, Columns):
            values = ", ".join(self.column(sql) for sql in spec.sql)
            return f"{self.name(spec.combine)}({values})"
        if isinstance(spec, Shape):
            return self.record(spec)
        if isinstance(spec, OrNone):
            # The nested record's columns first: the test is read after them.
            record = self.record(spec.shape)
            return f"({record} if {self.column(spec.sql)} is not None else None)"
        if spec is GIVEN:
            if field not in self.given:
                self.given.append(field)
            return field
        raise TypeError(f"field {field}: {spec!r} is not a column, a record or GIVEN")


def _qualified(spec: FieldSpec, alias: str) -> FieldSpec:
    if isinstance(spec, str):
        return _on(spec, alias)
    if isinstance(spec, Column):
        return Column(_on(spec.sql, alias), spec.convert)
    if isinstance(spec, Columns):
        return Columns(tuple(_on(sql, alias) for sql in spec.sql), spec.combine)
    if isinstance(spec, Shape):
        return spec.on(alias)
    if isinstance(spec, OrNone):
        return OrNone(spec.shape.on(alias), _on(spec.sql, alias))
    return spec


def _on(column: str, alias: str) -> str:
    if not column.isidentifier():
        raise ValueError(f"{column!r} is not a column name to qualify with {alias}")
    return f"{alias}.{column}"


class Written:
    """A row a statement writes, declared once: its table's columns in the
    order a function beside the declaration makes its values, each with its
    PostgreSQL type (PostgreSQL writes many rows at once from one array a
    column, and an array parameter's type must be named)."""

    def __init__(self, table: str, /, **types: str) -> None:
        self.table = table
        self.types = types
        self.columns = ", ".join(types)

    def __len__(self) -> int:
        return len(self.types)

    def without(self, *names: str) -> Written:
        """The same row without these columns (the database gives them)."""
        return Written(self.table, **{n: t for n, t in self.types.items() if n not in names})

    @property
    def insert(self) -> str:
        """An INSERT's head, `?` rows to follow: INSERT INTO t (a, b) VALUES"""
        return f"INSERT INTO {self.table} ({self.columns}) VALUES "

    @property
    def row(self) -> str:
        """One row's placeholders: (?,?,?)"""
        return "(" + ",".join("?" * len(self.types)) + ")"

    def from_arrays(self, start: int = 1) -> str:
        """PostgreSQL's INSERT of every row at once, one array parameter a
        column, numbered from `start`."""
        arrays = ", ".join(f"${n}::{t}[]" for n, t in enumerate(self.types.values(), start))
        return f"INSERT INTO {self.table} ({self.columns}) SELECT * FROM unnest({arrays})"
