"""The rows PostgreSQL's write jobs share: a delivery's history, its key's line."""

from __future__ import annotations

from collections.abc import Sequence

import relay.store.rows as rows
from relay.store.dialect import numbered
from relay.store.postgres.errors import Connection

# The ordering lines' SQL is SQLite's, numbered (one text, one meaning).
NEXT_IN_LINE = numbered(rows.NEXT_IN_LINE)  # (now, now, delivery id)
INSERT_LOG = numbered(rows.INSERT_LOG)
# The lines of these deliveries, locked as an accept joining them locks them
# (relay.store.postgres.accept, LOCK_KEYS of "line:<target>", key), in one
# order. A line's next is let go (NEXT_IN_LINE, SUCCESSES) only under it:
# else an accept that saw the head unfinished stores its delivery waiting,
# the head's record does not see that uncommitted delivery, and both commit
# a line that waits for ever. Under the lock, whichever comes second sees
# what the first committed.
LOCK_LINES = """
SELECT pg_advisory_xact_lock(h) FROM (
    SELECT DISTINCT hashtextextended('line:' || target || '/' || order_key, 0) AS h
    FROM deliveries WHERE id = ANY($1::bigint[]) AND order_key IS NOT NULL ORDER BY h) AS locks
"""


async def insert_log(
    connection: Connection,
    delivery_ids: Sequence[int],
    now: float,
    kind: str,
    detail: str,
    by: str | None = None,
) -> None:
    await connection.executemany(
        INSERT_LOG, [(delivery_id, now, kind, detail, by) for delivery_id in delivery_ids]
    )


async def lock_lines(connection: Connection, delivery_ids: Sequence[int]) -> None:
    """Lock these deliveries' lines (LOCK_LINES) to the transaction's end. Taken
    before any delivery's row lock, wherever both are: one order, no deadlock."""
    await connection.execute(LOCK_LINES, list(delivery_ids))


async def next_in_line(connection: Connection, delivery_ids: Sequence[int], now: float) -> None:
    """These deliveries are finished: the next of each one's line is due (its
    line locked first, see LOCK_LINES)."""
    await lock_lines(connection, delivery_ids)
    for delivery_id in delivery_ids:
        await connection.execute(NEXT_IN_LINE, now, now, delivery_id)
