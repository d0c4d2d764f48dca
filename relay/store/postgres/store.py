"""The PostgreSQL store: many relay instances, one database (asyncpg).

The same contract as the SQLite store (relay/store/base.py), for N
instances on any hosts:
- intake is group-committed (relay/store/postgres/accept.py); `synchronous_commit`
  on means the answer waits for the WAL flush, as SQLite's synchronous=FULL;
- deliveries are claimed with FOR UPDATE SKIP LOCKED and leased to this
  instance (`lease_owner`) until `lease_until`; an instance that dies loses
  its leases to the others once they expire, never before;
- `recover_orphans` gives back only what is this instance's own or expired:
  other instances' attempts under way are theirs;
- every state a person sets (pause) or relay learns (a target down) is a row
  all instances read.

One class a role of the contract, each over the same pool (connection.py);
the reads are the shared ones (relay.store.reads).
"""

from __future__ import annotations

from relay.store.postgres.health import PostgresHealth
from relay.store.postgres.indexing import PostgresIndexing
from relay.store.postgres.intake import PostgresIntake
from relay.store.postgres.maintenance import PostgresMaintenance
from relay.store.postgres.operations import PostgresOperations
from relay.store.postgres.queue import PostgresQueue
from relay.store.postgres.rhythm import PostgresRhythms
from relay.store.postgres.shared import PostgresShared
from relay.store.postgres.streaks import PostgresStreaks


class PostgresStore(
    PostgresIntake,
    PostgresQueue,
    PostgresOperations,
    PostgresIndexing,
    PostgresHealth,
    PostgresMaintenance,
    PostgresStreaks,
    PostgresRhythms,
    PostgresShared,
):
    pass
