"""The SQLite store: WAL, group-committed writes, reads on their own connections.

One class a role of the contract (relay/store/base.py), each over the same
connections (connection.py); the reads are the shared ones (relay.store.reads).
"""

from __future__ import annotations

from relay.store.sqlite.health import SqliteHealth
from relay.store.sqlite.indexing import SqliteIndexing
from relay.store.sqlite.intake import SqliteIntake
from relay.store.sqlite.maintenance import SqliteMaintenance
from relay.store.sqlite.operations import SqliteOperations
from relay.store.sqlite.queue import SqliteQueue
from relay.store.sqlite.rhythm import SqliteRhythms
from relay.store.sqlite.streaks import SqliteStreaks


class SqliteStore(
    SqliteIntake,
    SqliteQueue,
    SqliteOperations,
    SqliteIndexing,
    SqliteHealth,
    SqliteMaintenance,
    SqliteStreaks,
    SqliteRhythms,
):
    pass
