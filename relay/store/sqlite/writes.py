"""The rows SQLite's write jobs share: a delivery's history and view, the audit."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from relay.store.base import DeliveryView
from relay.store.columns import DELIVERY
from relay.store.rows import INSERT_AUDIT, INSERT_LOG, audit_values


def delivery(connection: sqlite3.Connection, delivery_id: int) -> DeliveryView:
    """A delivery as the job's transaction sees it (one it knows is there)."""
    row = connection.execute(
        f"SELECT {DELIVERY.columns} FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    return DELIVERY.from_row(row)


def insert_log(
    connection: sqlite3.Connection,
    delivery_ids: Iterable[int],
    now: float,
    kind: str,
    detail: str,
    by: str | None = None,
) -> None:
    connection.executemany(
        INSERT_LOG, [(delivery_id, now, kind, detail, by) for delivery_id in delivery_ids]
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
