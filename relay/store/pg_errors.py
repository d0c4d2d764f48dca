"""asyncpg's errors as the store's own (the httpx `_exceptions` idea).

"Cannot write now" (the server is away, restarting, out of connections or
space, a serialization or deadlock abort) becomes StoreUnavailable, which
ingress answers with 503 + Retry-After; anything else is a StoreError that
names what the server said.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

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
        | asyncpg.exceptions.ConnectionDoesNotExistError,
    ):
        return True
    if isinstance(error, asyncpg.PostgresError):
        state = str(getattr(error, "sqlstate", "") or "")
        return state.startswith(_ENVIRONMENTAL)
    return False


def unavailable(error: BaseException) -> StoreError:
    """A driver error as the store's own; the message says what the server said."""
    if isinstance(error, StoreError):
        return error
    if is_environmental(error):
        return StoreUnavailable(f"database cannot be reached or written: {_describe(error)}")
    return StoreError(f"database error: {_describe(error)}")


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
