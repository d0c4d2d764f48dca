"""The PostgreSQL store's streaks: a route's failed attempts in a row at a
target, the cluster's. Instances count their runs into the same rows, each
batch in one transaction holding its pairs' rows locked (in one order: two
batches never wait on each other in a cycle), so every run is counted once,
after the runs committed before it."""

from __future__ import annotations

from collections.abc import Sequence

from relay.store.base import RouteRun, RouteStreak
from relay.store.dialect import numbered
from relay.store.postgres.connection import PostgresConnection
from relay.store.postgres.errors import Connection
from relay.store.streaks import COLUMNS, FAILING, WRITE, counted, nothing_to_count, streaks_of

# Rows made first, so that two instances counting a new pair at once meet on
# its lock instead of both writing a count from 0. (routes, targets, now)
MAKE = """
INSERT INTO route_streaks (route, target, failures, updated_at)
SELECT route, target, 0, $3 FROM unnest($1::text[], $2::text[]) AS p(route, target)
ON CONFLICT (route, target) DO NOTHING
"""
LOCK = f"""
SELECT {COLUMNS} FROM route_streaks
WHERE (route, target) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY route, target FOR UPDATE
"""
WRITE_NUMBERED = numbered(WRITE)


class PostgresStreaks(PostgresConnection):
    async def count_runs(self, runs: Sequence[RouteRun], now: float) -> list[tuple[int, int]]:
        if not runs:
            return []
        if nothing_to_count(await self.route_streaks(), runs):
            # Read unlocked: a failure another instance counts meanwhile comes
            # after these, as its batch commits after this read.
            return [(0, 0)] * len(runs)
        pairs = sorted({(run.route, run.target) for run in runs})
        routes, targets = [pair[0] for pair in pairs], [pair[1] for pair in pairs]

        async def job(connection: Connection) -> list[tuple[int, int]]:
            await connection.execute(MAKE, routes, targets, now)
            rows = await connection.fetch(LOCK, routes, targets)
            answers, changed = counted(streaks_of(rows), runs)
            await connection.executemany(
                WRITE_NUMBERED,
                [(*key, streak.failures, streak.error, now) for key, streak in changed.items()],
            )
            return answers

        # Counted twice, a run would lengthen a streak twice: a batch whose
        # commit's answer was lost is asked about when it is counted again.
        return await self._write_settled(job, ("runs", tuple(runs)))

    async def route_streaks(self) -> dict[tuple[str, str], RouteStreak]:
        return streaks_of(await self._rows(FAILING))
