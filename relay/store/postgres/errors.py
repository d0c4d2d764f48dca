"""asyncpg's errors as the store's own (the httpx `_exceptions` idea).

"Cannot write now" (the server is away, restarting, out of connections or
space, a serialization or deadlock abort) becomes StoreUnavailable, which
ingress answers with 503 + Retry-After; anything else is a StoreError that
names what the server said.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from relay.core.errors import one_line
from relay.store.base import StoreError, StoreUnavailable

# A connection of relay's own or one lent by the pool: the same verbs.
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"

# SQLSTATE classes that say "the database cannot take this now", not "this is wrong":
# 08 connection, 40 transaction rollback (serialization, deadlock), 53 insufficient
# resources (disk full, too many connections), 57 operator intervention (shutdown,
# cannot connect now), 58 system error (I/O), 25006 read-only transaction (a standby).
_ENVIRONMENTAL = ("08", "40", "53", "57", "58", "25006", "XX")


def is_environmental(error: BaseException) -> bool:
    if isinstance(error, StoreUnavailable):
        return True
    if isinstance(
        error,
        OSError
        | ConnectionError
        | asyncio.TimeoutError
        | asyncpg.InterfaceError
        | asyncpg.exceptions.InternalClientError
        | asyncpg.exceptions.ConnectionDoesNotExistError,
    ):
        return True
    if isinstance(error, asyncpg.PostgresError):
        state = str(getattr(error, "sqlstate", "") or "")
        return state.startswith(_ENVIRONMENTAL)
    return False


POOLER = (
    "a pooler in transaction or statement mode is in between (PgBouncer's pool_mode ="
    " transaction). relay needs session pooling: the lead and each instance's name are"
    " session advisory locks, and wake-ups LISTEN on a session. Give relay's database"
    " pool_mode = session, or connect to PostgreSQL directly (docs/postgres.md, PgBouncer)"
)
# What a session's prepared statements vanishing or colliding between two
# statements looks like: another client's session, handed out per transaction.
_POOLED = (
    asyncpg.exceptions.DuplicatePreparedStatementError,
    asyncpg.exceptions.InvalidSQLStatementNameError,
)


def unavailable(error: BaseException) -> StoreError:
    """A driver error as the store's own; the message says what the server said."""
    if isinstance(error, StoreError):
        return error
    if isinstance(error, _POOLED):
        said = one_line(error)
        return StoreError(f"the session changed between two statements ({said}): {POOLER}")
    if isinstance(error, asyncpg.exceptions.InternalClientError):
        # The driver's own state machine ("cannot switch to state 15"), seen
        # when a connection breaks mid-operation: what an operator needs is
        # the break, not asyncpg's internals.
        return StoreUnavailable(
            "database cannot be reached or written: the connection broke during an operation"
        )
    if is_environmental(error):
        return StoreUnavailable(f"database cannot be reached or written: {one_line(error)}")
    return StoreError(f"database error: {one_line(error)}")


def at(where: str, error: BaseException) -> StoreError:
    """`unavailable(error)`, saying first which database (`where`: a URL
    without its password, and the setting that named it)."""
    found = unavailable(error)
    return type(found)(f"{where}: {found}")


# What a driver call can raise, all of it turned into the store's own errors.
DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


class OneLine(logging.Filter):
    """asyncpg's pool logs a whole traceback each time it cannot reconnect
    (the database is away): one line is what an operator needs, and only at
    debug level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            # "Failed to restore the pool connection floor; retrying", a
            # warning a second while the database is away: relay's own lines
            # say when it went and when it is back (ingress, scheduler). Kept
            # at debug level.
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            if not logging.getLogger("relay").isEnabledFor(logging.DEBUG):
                return False
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()}: {one_line(record.exc_info[1])}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


logging.getLogger("asyncpg.pool").addFilter(OneLine())
