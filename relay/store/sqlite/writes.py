"""The rows SQLite's write jobs share: a delivery's row, its history, the audit."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from relay.store.rows import DELIVERY_COLUMNS, INSERT_AUDIT, audit_values


def select_delivery(connection: sqlite3.Connection, delivery_id: int) -> Sequence[Any]:
    row: Sequence[Any] = connection.execute(
        f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    return row


def insert_log(
    connection: sqlite3.Connection,
    delivery_ids: Iterable[int],
    now: float,
    kind: str,
    detail: str,
    by: str | None = None,
) -> None:
    connection.executemany(
        "INSERT INTO delivery_log (delivery_id, at, kind, detail, by) VALUES (?, ?, ?, ?, ?)",
        [(delivery_id, now, kind, detail, by) for delivery_id in delivery_ids],
    )


def insert_audit(
    connection: sqlite3.Connection,
    now: float,
    by: str,
    action: str,
    subject: str,
    delivery_ids: Sequence[int] = (),
) -> None:
    connection.execute(INSERT_AUDIT, audit_values(now, by, action, subject, delivery_ids))
