"""What instances of a cluster share: limits for the whole cluster, the lead,
alerts noted by all and sent by the leader, wake-ups, the list of instances."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from relay.config import Config
from relay.store.accept import AcceptJob
from relay.store.base import Accepted, AlertNote, InstanceState, NewDelivery, NewEvent
from relay.store.columns import ALERT_NOTE
from relay.store.postgres.accept import store_batch
from relay.store.postgres.cluster import (
    INSTANCES,
    LEADER_LOCK,
    NAME_LOCK,
    TargetLimits,
    cluster_limits,
    listen_forever,
)
from relay.store.postgres.connection import CHANNEL, PostgresConnection
from relay.store.postgres.errors import Connection

# An instance gone this long without leases is left out of the list (rows of
# instances named by default, one per start, are not worth an operator's eye).
SHOWN_FOR = 86400.0


class _AlreadySent(Exception):
    """Rolls back an alert whose notes another instance took first."""


class PostgresShared(PostgresConnection):
    def set_limits(self, limits: Mapping[str, TargetLimits]) -> None:
        """Targets' concurrency and rates as totals for the whole cluster
        (relay.store.postgres.cluster.cluster_limits of the config in force)."""
        self._limits = dict(limits)

    def reconfigure(self, config: Config) -> None:
        """The config's target limits, as totals for the whole cluster."""
        self.set_limits(cluster_limits(config))

    async def lead(self) -> bool:
        """Whether this instance runs the singletons (retention, alert grouping,
        gauges, the search index) now; takes the lead when it is free. One
        caller at a time."""
        return await self._leadership.lead()

    async def note_alerts(self, notes: Sequence[bytes], now: float) -> None:
        async def job(connection: Connection) -> None:
            await connection.execute(
                "INSERT INTO alert_notes (noted_at, note) SELECT $1, n FROM unnest($2::bytea[]) n",
                now,
                list(notes),
            )

        # Noted twice, a note may be said in two alerts (the leader sending
        # between the two).
        await self._write_settled(job, ("notes", tuple(notes)))

    async def alert_notes(self) -> list[AlertNote]:
        rows = await self._rows(f"SELECT {ALERT_NOTE.columns} FROM alert_notes ORDER BY id")
        return list(map(ALERT_NOTE.from_row, rows))

    async def send_alert(
        self,
        notes: Collection[int],
        event: NewEvent | None,
        deliveries: Sequence[NewDelivery],
        now: float,
    ) -> Accepted | None:
        ids = sorted(notes)

        async def job(connection: Connection) -> Accepted | None:
            taken = await connection.fetchval(
                "WITH taken AS (DELETE FROM alert_notes WHERE id = ANY($1::bigint[]) RETURNING 1)"
                " SELECT COUNT(*) FROM taken",
                ids,
            )
            if taken != len(ids):
                # Sent (in part) by another instance that thought it led: say nothing.
                raise _AlreadySent
            if event is None:
                return None
            [accepted] = await store_batch(connection, [AcceptJob(event, deliveries, now)])
            await connection.execute("SELECT pg_notify($1, 'event')", CHANNEL)
            return accepted

        try:
            return await self._write(job)
        except _AlreadySent:
            return None

    async def listen(self, callback: Callable[[str], None]) -> None:
        """Call `callback` with every wake-up any instance sends, until cancelled."""
        await listen_forever(self.url, CHANNEL, callback, self.instance_id)

    async def instances(self) -> list[InstanceState]:
        rows = await self._rows(
            INSTANCES,
            LEADER_LOCK >> 32,
            LEADER_LOCK & 0xFFFFFFFF,
            NAME_LOCK,
            self.dead_after,
            SHOWN_FOR,
        )
        return [
            InstanceState(
                id=row["id"],
                host=row["host"],
                started_at=row["started_at"],
                last_heartbeat=row["beat"],
                heartbeat_age=None if row["beat"] is None else max(0.0, row["now"] - row["beat"]),
                state=row["state"],
                leases=row["leases"],
                leader=row["leader"],
            )
            for row in rows
        ]

    async def server_settings(self) -> dict[str, str]:
        """The server's durability settings, for `relay check`."""
        rows = await self._rows(
            "SELECT name, setting FROM pg_settings"
            " WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')"
        )
        return {name: setting for name, setting in rows}
